package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.protocol.BatchSchema;
import io.unstall.flight.protocol.PrepNextReply;
import io.unstall.flight.protocol.PrepTicket;
import java.io.IOException;
import java.util.concurrent.locks.LockSupport;
import java.util.function.BooleanSupplier;
import org.apache.arrow.flight.CallStatus;
import org.apache.arrow.flight.FlightProducer.ServerStreamListener;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.BitVector;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.compression.CompressionUtil;
import org.apache.arrow.vector.ipc.message.ArrowRecordBatch;

/**
 * A group's members' requests for batches: PREP DoGet ({@link #serve}, whose sending is the one small method
 * {@code send}), the shared-memory read ({@code prep.next}), and an external group's claims and uploads
 * ({@code prep.claim}, {@code prep.release}, DoPut). Each waits, under the group lock, until its batch is staged
 * (or, for a claim, until it is this member's turn), and moves the member's cursor; the group frees what every
 * member is past ({@code releasePassed}) and what a finished member held ({@code removal}).
 */
final class Serving {
  private static final ObjectMapper JSON = new ObjectMapper();

  /** What the group does when a member went (it was the last: {@code closedGroup}); the caller holds the lock. */
  interface Removal {
    void removed(long memberId, boolean closedGroup);
  }

  private final String id;
  private final BatchOrder order;
  private final Membership members;
  private final Staging staging;
  private final BatchSource source;
  private final MemberUploads uploads; // the source of an external group; null when the sidecar makes the batches
  private final CompressedBatches compressed;
  private final Autotuner tuner;
  private final PrepCounts counts;
  private final PrepGroup.Limits limits;
  private final GroupLock lock;
  private final Runnable releasePassed; // frees every staged batch all members are past (the lock held)
  private final Removal removal;

  Serving(BatchOrder order, Membership members, Staging staging, BatchSource source, MemberUploads uploads,
      CompressedBatches compressed, Autotuner tuner, PrepCounts counts, PrepGroup.Limits limits, GroupLock lock,
      Runnable releasePassed, Removal removal) {
    this.id = order.group;
    this.order = order;
    this.members = members;
    this.staging = staging;
    this.source = source;
    this.uploads = uploads;
    this.compressed = compressed;
    this.tuner = tuner;
    this.counts = counts;
    this.limits = limits;
    this.lock = lock;
    this.releasePassed = releasePassed;
    this.removal = removal;
  }

  /** Checks a member's request and moves its cursor forward to it (the batch is held until the cursor passes). */
  private long checkedPosition(Membership.Member m, long epoch, long batch) {
    long pos = members.position(m, epoch, batch);
    if (pos > m.cursor) { // skipped ahead, or (shared memory) moved on: its holds on earlier batches end
      m.cursor = pos;
      releasePassed.run();
      lock.changed();
    }
    return pos;
  }

  // -- reads ----------------------------------------------------------------------------------------------

  /** Serves one batch to one member: waits until it is staged, sends it, then advances the member's cursor. */
  void serve(PrepTicket t, ServerStreamListener listener) throws InterruptedException {
    VectorSchemaRoot view;
    long pos;
    synchronized (lock) {
      Membership.Member m = members.member(t.member());
      pos = checkedPosition(m, t.epoch(), t.batch());
      m.waiting++;
      try {
        awaitStaged(m, pos, listener::isCancelled);
      } catch (FlightRuntimeException e) {
        if (listener.isCancelled()) {
          return;
        }
        throw e;
      } finally {
        m.waiting--;
      }
      view = staging.share(pos);
    }
    boolean sent = false;
    try {
      sent = send(listener, view, t.member(), pos);
    } finally {
      view.close();
      synchronized (lock) {
        staging.sent();
        Membership.Member m = members.isMember(t.member()) ? members.member(t.member()) : null;
        if (sent) {
          counts.batchesServed++;
        }
        boolean closed = false;
        if (sent && m != null) {
          m.cursor = Math.max(m.cursor, m.next(pos + 1)); // a rank's next batch: the ones between are others'
          m.lastSeen = System.nanoTime();
          if (m.cursor >= m.endPos) {
            closed = members.remove(m, "finished its " + (m.endPos - m.startPos) / order.numBatches + " epochs");
            removal.removed(m.id, closed);
          }
        }
        releasePassed.run();
        lock.changed();
      }
    }
  }

  /** Sends one staged batch (a view of it) on a DoGet stream; false when the member cancelled. No lock held. */
  private boolean send(ServerStreamListener listener, VectorSchemaRoot view, long member, long pos) {
    // gRPC writes from the staged buffers themselves: they are reference counted and never written while a send
    // holds them (a staged batch is immutable; a shared-memory slot is reused only once its count drops)
    listener.setUseZeroCopy(true);
    CompressionUtil.CodecType codec = compressed.of(member);
    try (ArrowRecordBatch sentCompressed = codec == null ? null : compressed.send(listener, view, pos, codec)) {
      if (codec == null) {
        listener.start(view);
      }
      return awaitAndPut(listener, member, pos);
    }
  }

  private boolean awaitAndPut(ServerStreamListener listener, long member, long pos) {
    long deadline = limits.deadline();
    while (!listener.isReady() && !listener.isCancelled()) {
      limits.check(deadline, id, "member " + member + " to take " + order.at(pos));
      LockSupport.parkNanos(20_000);
    }
    if (listener.isCancelled()) {
      return false;
    }
    listener.putNext();
    listener.completed();
    return true;
  }

  /**
   * Shared-memory read (the {@code prep.next} action): waits until batch {@code (epoch, batch)} is staged and
   * names its /dev/shm file (its tensor, or a raw or hybrid batch's payloads: {@link PrepNextReply}). The member
   * holds that batch until it asks for a later one (or leaves), since it maps the file after this returns.
   * {@code released}: the batches whose files the member no longer maps (null: it does not say; then no file it
   * mapped is written again, {@link ShmSlots}).
   */
  ObjectNode next(long memberId, long epoch, long batch, long[][] released, BooleanSupplier cancelled)
      throws InterruptedException {
    if (!staging.shm()) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + id
          + " does not stage in shared memory; read batches with PREP DoGet tickets").toRuntimeException();
    }
    synchronized (lock) {
      Membership.Member m = members.member(memberId);
      if (released != null) {
        m.reportsReleases = true;
        for (long[] at : released) {
          staging.releasedBy(m.id, at[0] * order.numBatches + at[1]);
        }
        lock.changed();
      }
      long pos = checkedPosition(m, epoch, batch);
      m.waiting++;
      try {
        awaitStaged(m, pos, cancelled);
      } finally {
        m.waiting--;
      }
      VectorSchemaRoot r = staging.get(pos);
      if (r.getRowCount() > 0) { // an empty batch has nothing to map
        staging.mapped(pos, m.id, m.reportsReleases);
      }
      ObjectNode o = reply(r, staging.shmPath(pos));
      String skipped = r.getSchema().getCustomMetadata().get(PrepSchema.SKIPPED);
      if (skipped != null) {
        try {
          o.set("skipped", JSON.readTree(skipped));
        } catch (IOException e) {
          throw new IllegalStateException(e); // written by SidecarPrep
        }
      }
      counts.batchesServed++;
      m.lastSeen = System.nanoTime();
      return o;
    }
  }

  /** The {@code prep.next} answer for staged batch {@code r} in slot {@code path}: its tensor, or its payloads. */
  private ObjectNode reply(VectorSchemaRoot r, String path) {
    int n = r.getRowCount();
    long[] ids = new long[n];
    long[] labels = new long[n];
    BigIntVector idVector = (BigIntVector) r.getVector(BatchSchema.ID); // the same names in PrepSchema
    BigIntVector labelVector = (BigIntVector) r.getVector(BatchSchema.LABEL);
    for (int i = 0; i < n; i++) {
      ids[i] = idVector.get(i);
      labels[i] = labelVector.isNull(i) ? -1 : labelVector.get(i);
    }
    PrepPipeline pipeline = source.pipeline();
    if (pipeline != null) {
      return PrepNextReply.tensor(path, pipeline.sampleShape(), pipeline.dtype().wire(), ids, labels);
    }
    VarCharVector keyVector = (VarCharVector) r.getVector(BatchSchema.KEY);
    VarBinaryVector payload = (VarBinaryVector) r.getVector(BatchSchema.PAYLOAD);
    BitVector preparedVector = (BitVector) r.getVector(HybridPrep.PREPARED); // null: a raw group
    BigIntVector headerVector = (BigIntVector) r.getVector(VouchedHeaders.COLUMN);
    String[] keys = new String[n];
    int[] offsets = new int[n + 1];
    long[] headers = new long[n];
    boolean[] prepared = preparedVector == null ? null : new boolean[n];
    for (int i = 0; i < n; i++) {
      keys[i] = keyVector.getObject(i).toString();
      offsets[i] = payload.getStartOffset(i);
      headers[i] = headerVector.isNull(i) ? VouchedHeaders.NONE : headerVector.get(i);
      if (prepared != null) {
        prepared[i] = preparedVector.get(i) != 0;
      }
    }
    offsets[n] = payload.getStartOffset(n);
    return PrepNextReply.payloads(path, ids, labels, keys, offsets, headers, prepared);
  }

  private void awaitStaged(Membership.Member m, long pos, BooleanSupplier cancelled) throws InterruptedException {
    long deadline = limits.deadline();
    if (!staging.has(pos) && staging.failure(pos) == null) {
      tuner.stalled();
    }
    while (!staging.has(pos)) {
      FlightRuntimeException f = staging.failure(pos);
      if (f != null) {
        throw f;
      }
      if (cancelled.getAsBoolean()) {
        throw CallStatus.CANCELLED.withDescription("the call was cancelled").toRuntimeException();
      }
      if (!members.isMember(m.id)) {
        members.member(m.id); // throws, naming why
      }
      if (members.closed()) {
        throw CallStatus.UNAVAILABLE.withDescription("prep group " + id + " closed (sidecar stopping)")
            .toRuntimeException();
      }
      limits.check(deadline, id, order.at(pos) + " to be prepared"
          + (uploads != null ? uploads.claimer(pos) : ""));
      m.lastSeen = System.nanoTime();
      lock.await(10);
    }
  }

  /** Sets (or clears) the Arrow IPC body compression of the batches {@code member} reads over Flight. */
  void setCompression(long memberId, CompressionUtil.CodecType codec) {
    synchronized (lock) {
      members.member(memberId);
    }
    compressed.setMember(memberId, codec);
  }

  // -- member uploads (external groups) ---------------------------------------------------------------------

  /**
   * External groups (the {@code prep.claim} action): waits until batch {@code (epoch, batch)} is staged
   * ({@code "ready"}: read it with a PREP DoGet) or nobody alive prepares it and it is within the window
   * ({@code "produce"}: this member fetches the returned ids, transforms them and uploads the batch with DoPut).
   * A claimer that is dropped or leaves gives its claim back, so a dead job never blocks the others for longer
   * than the member timeout, and a claim not uploaded within the claim timeout is given back too (its member
   * gets an error if it uploads late).
   */
  ObjectNode claim(long memberId, long epoch, long batch, BooleanSupplier cancelled) throws InterruptedException {
    checkUploads("prep.claim");
    synchronized (lock) {
      Membership.Member m = members.member(memberId);
      long pos = checkedPosition(m, epoch, batch);
      m.waiting++;
      try {
        return uploads.claim(m, pos, cancelled);
      } finally {
        m.waiting--;
      }
    }
  }

  /** DataLoader worker processes' claims ({@code prep.claim} with {@code "next": true}): see MemberUploads. */
  ObjectNode claimNext(long memberId, long epoch, long waitNanos, BooleanSupplier cancelled)
      throws InterruptedException {
    checkUploads("prep.claim");
    synchronized (lock) {
      Membership.Member m = members.member(memberId);
      m.waiting++;
      try {
        return uploads.claimNext(m, epoch, waitNanos, cancelled);
      } finally {
        m.waiting--;
      }
    }
  }

  /** A member gives back its claim on batch {@code (epoch, batch)} ({@code prep.release}); false if it held none. */
  boolean release(long memberId, long epoch, long batch, String reason) {
    checkUploads("prep.release");
    synchronized (lock) {
      return uploads.giveBack(members.member(memberId), order.pos(epoch, batch), reason);
    }
  }

  private void checkUploads(String action) {
    if (uploads == null) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + id + " is prepared by the sidecar; " + action
          + " is for groups joined with {\"python\": fingerprint}").toRuntimeException();
    }
  }

  /** Stages a batch a member prepared (DoPut): its ids must be the claimed batch's, its size within staging. */
  void upload(long memberId, long epoch, long batch, VectorSchemaRoot in, BooleanSupplier cancelled)
      throws InterruptedException {
    if (uploads == null) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + id
          + " is prepared by the sidecar; only groups joined with {\"python\": fingerprint} take uploads")
          .toRuntimeException();
    }
    uploads.upload(memberId, epoch, batch, in, cancelled);
  }
}
