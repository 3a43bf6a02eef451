package io.unstall.flight.local;

import io.unstall.flight.BatchAssembler;
import io.unstall.flight.Bounds;
import io.unstall.flight.Prefetcher;
import io.unstall.flight.StreamBudget;
import io.unstall.flight.UnstallProducer;
import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.auth.Principal;
import io.unstall.flight.dataset.DatasetRegistry;
import io.unstall.flight.prep.PrepService;
import io.unstall.flight.protocol.LocalFrames;
import io.unstall.flight.session.FetchSession;
import io.unstall.flight.session.Sessions;
import io.unstall.flight.shm.SharedMemory;
import io.unstall.flight.shm.ShmBuffer;
import io.unstall.flight.shm.ShmRef;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.BooleanSupplier;
import org.apache.arrow.flight.Action;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;

/**
 * What the local socket's requests do, apart from framing: sessions, batches in shared memory, plans, and the
 * prep group actions of same-host members (a {@code prep.next} a batch, without gRPC).
 */
public final class LocalService {
  private final byte[] token;
  private final DatasetRegistry registry;
  private final Sessions sessions;
  private final BatchAssembler assembler;
  private final BufferAllocator streams;
  private final StreamBudget budget;
  private final SharedMemory shm;
  private final Bounds bounds;
  private final PrepService prep;
  private final AtomicLong stagingFiles = new AtomicLong();

  public LocalService(
      String token, DatasetRegistry registry, Sessions sessions, BatchAssembler assembler, BufferAllocator streams,
      StreamBudget budget, SharedMemory shm, Bounds bounds, PrepService prep) {
    this.bounds = bounds;
    this.prep = prep;
    this.token = token.getBytes(StandardCharsets.UTF_8);
    this.registry = registry;
    this.sessions = sessions;
    this.assembler = assembler;
    this.streams = streams;
    this.budget = budget;
    this.shm = shm;
  }

  boolean authenticate(byte[] presented) {
    return MessageDigest.isEqual(token, presented);
  }

  String shmDir() {
    return shm.dir().toString();
  }

  FetchSession open(String dataset, String name) {
    Dataset d = registry.get(dataset);
    return sessions.open(d, name, "shm");
  }

  FetchSession session(long id) {
    return sessions.get(id);
  }

  void close(long session) {
    sessions.close(session);
  }

  Bounds bounds() {
    return bounds;
  }

  /**
   * A {@code prep.*} action, run as DoAction runs it for the owner: HELLO took the owner's token, the only one the
   * socket accepts. Its result is the same JSON document.
   */
  byte[] prepAction(LocalFrames.PrepAction a, BooleanSupplier cancelled) throws Exception {
    return prep.doAction(new Action(a.type(), a.body()), cancelled, Principal.OWNER);
  }

  int plan(FetchSession s, long epoch, long[] requested) {
    Dataset d = s.dataset();
    int[] ids = Prefetcher.checkedPlan(d, requested, bounds.maxPlanIds());
    assembler.prefetcher().plan(d, s.owner(), s.stats(), epoch, ids);
    return ids.length;
  }

  /** The {@code cached} document of the session's dataset ({@link UnstallProducer#cachedJson}). */
  String cached(FetchSession s) {
    return UnstallProducer.cachedJson(s.dataset(), assembler);
  }

  /** A same-host batch: rows referenced in the cache's segments, the rest in {@code staging} (may be null). */
  record Batch(int[] ids, ShmRef[] refs, long[] stagedAt, ArrowBuf staging, String stagingFile) {}

  Batch fetch(FetchSession s, long epoch, long[] requested) throws IOException, InterruptedException {
    Dataset d = s.dataset();
    BatchAssembler.CheckedIds checked = BatchAssembler.startFetch(d, requested, epoch);
    int n = checked.ids().length;
    ShmRef[] refs = new ShmRef[n];
    long[] stagedAt = new long[n];
    String[] file = new String[1];
    ArrowBuf staging = assembler.assembleLocal(d, new BatchAssembler.Requester(s.owner(), s.stats()), epoch,
        checked.ids(), refs, stagedAt, bytes -> {
          // Wait for room in the streams budget, as a Flight batch does; the file is counted by that allocator.
          try (StreamBudget.Reservation r = budget.acquire(budget.cost(bytes, n))) {
            file[0] = "stage-" + stagingFiles.incrementAndGet();
            ShmBuffer buf = ShmBuffer.create(shm.resolve(file[0]), bytes, false);
            try {
              return streams.wrapForeignAllocation(buf);
            } catch (RuntimeException e) {
              buf.discard();
              throw e;
            }
          } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IOException("interrupted waiting for memory", e);
          }
        });
    return new Batch(checked.ids(), refs, stagedAt, staging, file[0]);
  }
}
