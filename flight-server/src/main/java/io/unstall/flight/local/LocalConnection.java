package io.unstall.flight.local;

import static io.unstall.flight.protocol.LocalFrames.CACHED;
import static io.unstall.flight.protocol.LocalFrames.CLOSE;
import static io.unstall.flight.protocol.LocalFrames.FETCH;
import static io.unstall.flight.protocol.LocalFrames.HELLO;
import static io.unstall.flight.protocol.LocalFrames.INTERNAL;
import static io.unstall.flight.protocol.LocalFrames.INVALID_ARGUMENT;
import static io.unstall.flight.protocol.LocalFrames.MAX_FRAME;
import static io.unstall.flight.protocol.LocalFrames.NOT_FOUND;
import static io.unstall.flight.protocol.LocalFrames.OPEN;
import static io.unstall.flight.protocol.LocalFrames.PLAN;
import static io.unstall.flight.protocol.LocalFrames.PREP;
import static io.unstall.flight.protocol.LocalFrames.RESOURCE_EXHAUSTED;
import static io.unstall.flight.protocol.LocalFrames.UNAUTHENTICATED;
import static io.unstall.flight.protocol.LocalFrames.UNAVAILABLE;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.UnstallProducer;
import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.protocol.LocalFrames;
import io.unstall.flight.session.FetchSession;
import io.unstall.flight.shm.ShmRef;
import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.function.Consumer;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.flight.FlightStatusCode;
import org.apache.arrow.memory.ArrowBuf;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One client connection of the local socket: HELLO first, then requests answered in order. It owns the
 * sessions it opened (closed with it) and the staging file of its last batch, freed when the next request
 * arrives (the client has mapped it by then) or when the connection ends.
 */
final class LocalConnection implements Runnable {
  private static final Logger LOG = LoggerFactory.getLogger(LocalConnection.class);
  private static final ObjectMapper JSON = new ObjectMapper();

  private final SocketChannel ch;
  private final LocalService service;
  private final Consumer<LocalConnection> onEnd;
  private final Set<Long> opened = new HashSet<>();
  private final ByteBuffer header = ByteBuffer.allocate(4).order(ByteOrder.LITTLE_ENDIAN);
  private ArrowBuf lastStaging;
  private boolean authenticated;

  LocalConnection(SocketChannel ch, LocalService service, Consumer<LocalConnection> onEnd) {
    this.ch = ch;
    this.service = service;
    this.onEnd = onEnd;
  }

  /**
   * Answers a connection that cannot be served with one error ({@code code}: a LocalFrames status), then closes
   * it. The client reads it in reply to its HELLO (or after its HELLO failed to send: the reply is already in its
   * socket's buffer).
   */
  static void refuse(SocketChannel ch, int code, String why) {
    try (ch) {
      write(ch, ByteBuffer.wrap(LocalFrames.error(code, why)));
    } catch (IOException e) {
      LOG.debug("refusing a local connection: {}", e.toString());
    }
  }

  @Override
  public void run() {
    try {
      while (true) {
        ByteBuffer body = readFrame();
        if (body == null) {
          return;
        }
        releaseStaging(); // the client mapped the last batch's staging file before sending this
        int kind = Byte.toUnsignedInt(body.get());
        if (!authenticated && kind != HELLO) {
          write(ch, ByteBuffer.wrap(LocalFrames.error(UNAUTHENTICATED, "send HELLO with the sidecar's token first")));
          return;
        }
        ByteBuffer reply;
        try {
          reply = handle(kind, body);
        } catch (AuthFailure e) {
          write(ch, ByteBuffer.wrap(LocalFrames.error(UNAUTHENTICATED, e.getMessage())));
          return;
        } catch (Throwable e) {
          reply = ByteBuffer.wrap(errorFrame(e));
        }
        write(ch, reply);
      }
    } catch (IOException e) {
      LOG.debug("local connection ended: {}", e.toString());
    } finally {
      close();
      onEnd.accept(this);
    }
  }

  private ByteBuffer handle(int kind, ByteBuffer body) throws Exception {
    switch (kind) {
      case HELLO -> {
        if (!service.authenticate(LocalFrames.parseHello(body))) {
          throw new AuthFailure("wrong token (the sidecar's token file is $UNSTALL_HOME/token)");
        }
        authenticated = true;
        ObjectNode o = JSON.createObjectNode().put("v", 1).put("pid", ProcessHandle.current().pid())
            .put("shm", service.shmDir());
        return ok(o);
      }
      case OPEN -> {
        LocalFrames.Open req = LocalFrames.parseOpen(body);
        FetchSession s = service.open(req.dataset(), req.name());
        synchronized (opened) {
          opened.add(s.id());
        }
        return ok(JSON.createObjectNode().put("v", 1).put("session", s.id()).put("dataset", req.dataset()));
      }
      case FETCH -> {
        LocalFrames.IdList req = LocalFrames.parseIds(body, FETCH);
        FetchSession s = service.session(req.session());
        LocalService.Batch b = service.fetch(s, req.epoch(), req.ids());
        holdStaging(b.staging());
        return encode(s.dataset(), b);
      }
      case PLAN -> {
        LocalFrames.IdList req = LocalFrames.parseIds(body, PLAN);
        int planned = service.plan(service.session(req.session()), req.epoch(), req.ids());
        return ok(JSON.createObjectNode().put("v", 1).put("planned", planned));
      }
      case PREP -> {
        byte[] result = service.prepAction(LocalFrames.parsePrep(body), () -> !ch.isOpen());
        return ByteBuffer.wrap(LocalFrames.ok(result));
      }
      case CACHED -> {
        return ByteBuffer.wrap(LocalFrames.ok(service.cached(service.session(LocalFrames.parseSession(body)))));
      }
      case CLOSE -> {
        long id = LocalFrames.parseSession(body);
        service.close(id);
        synchronized (opened) {
          opened.remove(id);
        }
        return ok(JSON.createObjectNode().put("v", 1).put("closed", true));
      }
      default -> throw new IllegalArgumentException(
          "malformed local request: unknown kind " + kind
              + " (1 HELLO, 2 OPEN, 3 FETCH, 4 PLAN, 5 CLOSE, 6 PREP, 7 CACHED)");
    }
  }

  private static ByteBuffer encode(Dataset d, LocalService.Batch b) {
    int n = b.ids().length;
    long[] ids = new long[n];
    long[] labels = new long[n];
    boolean[] valid = new boolean[n];
    long[] offsets = new long[n];
    int[] lengths = new int[n];
    int[] segs = new int[n];
    byte[][] keys = new byte[n][];
    List<String> segments = new ArrayList<>();
    Map<String, Integer> segIndex = new HashMap<>();
    boolean labelled = d.labelled();
    for (int i = 0; i < n; i++) {
      int id = b.ids()[i];
      ids[i] = id;
      if (labelled) {
        labels[i] = d.label(id);
        valid[i] = true;
      }
      keys[i] = d.key(id).getBytes(StandardCharsets.UTF_8);
      ShmRef ref = b.refs()[i];
      String file = ref != null ? ref.file() : b.stagingFile();
      offsets[i] = ref != null ? ref.offset() : b.stagedAt()[i];
      lengths[i] = d.length(id);
      segs[i] = segIndex.computeIfAbsent(file, f -> {
        segments.add(f);
        return segments.size() - 1;
      });
    }
    return LocalFrames.batch(ids, labels, valid, offsets, lengths, segs, keys, segments);
  }

  private static ByteBuffer ok(ObjectNode o) {
    return ByteBuffer.wrap(LocalFrames.ok(o.toString()));
  }

  /** The same status and message a Flight client would get for this failure. */
  private static byte[] errorFrame(Throwable e) {
    FlightRuntimeException status = UnstallProducer.toStatus(e);
    FlightStatusCode code = status.status().code();
    int local = switch (code) {
      case INVALID_ARGUMENT, UNIMPLEMENTED -> INVALID_ARGUMENT; // UNIMPLEMENTED: an unknown prep.* action
      case NOT_FOUND -> NOT_FOUND;
      case RESOURCE_EXHAUSTED -> RESOURCE_EXHAUSTED;
      case UNAUTHENTICATED, UNAUTHORIZED -> UNAUTHENTICATED;
      case UNAVAILABLE, CANCELLED, TIMED_OUT -> UNAVAILABLE; // the shim asks again, as after its own deadline
      default -> INTERNAL;
    };
    if (local == INTERNAL && !(e instanceof IOException)) {
      LOG.warn("local fetch failed: {}", status.getMessage(), e); // a bug: keep the stack
    } else {
      LOG.info("local request rejected: {}", status.getMessage());
    }
    return LocalFrames.error(local, status.getMessage());
  }

  /** The longest HELLO: kind, magic, version, token length and a token of up to 64 KiB. */
  private static final int MAX_HELLO = 1 + 7 + 0xFFFF;

  private ByteBuffer readFrame() throws IOException {
    header.clear();
    if (!readFully(header, true)) {
      return null;
    }
    long len = Integer.toUnsignedLong(header.flip().getInt());
    if (len < 1 || len > MAX_FRAME) {
      write(ch, ByteBuffer.wrap(LocalFrames.error(INVALID_ARGUMENT,
          "malformed local request: frame length " + len + " not in 1.." + MAX_FRAME)));
      throw new EOFException("bad frame length " + len);
    }
    // Nothing is allocated for a frame longer than any request this connection may send: before HELLO, a HELLO;
    // after it, a PLAN of --max-plan-ids ids (FETCHes are shorter).
    int maxPlanIds = Math.min(service.bounds().maxPlanIds(), LocalFrames.MAX_PLAN_IDS);
    long allowed = authenticated ? Math.max(17 + 8L * maxPlanIds, 17 + 8L * LocalFrames.MAX_FETCH_IDS) : MAX_HELLO;
    if (len > allowed) {
      write(ch, ByteBuffer.wrap(authenticated
          ? LocalFrames.error(RESOURCE_EXHAUSTED, "a local request of " + len + " bytes is longer than a plan of"
              + " --max-plan-ids " + maxPlanIds + " ids; send a shorter plan or raise --max-plan-ids")
          : LocalFrames.error(INVALID_ARGUMENT, "malformed local request: a " + len + "-byte frame before HELLO"
              + " (send HELLO with the sidecar's token first)")));
      throw new EOFException("frame of " + len + " bytes over " + allowed);
    }
    ByteBuffer body = ByteBuffer.allocate((int) len).order(ByteOrder.LITTLE_ENDIAN);
    readFully(body, false);
    return body.flip();
  }

  /** Reads until {@code b} is full; false on a clean end of stream before the first byte. */
  private boolean readFully(ByteBuffer b, boolean eofOk) throws IOException {
    boolean first = true;
    while (b.hasRemaining()) {
      if (ch.read(b) < 0) {
        if (first && eofOk) {
          return false;
        }
        throw new EOFException("connection closed mid-frame");
      }
      first = false;
    }
    return true;
  }

  private static void write(SocketChannel ch, ByteBuffer body) throws IOException {
    ByteBuffer len = ByteBuffer.allocate(4).order(ByteOrder.LITTLE_ENDIAN).putInt(body.remaining()).flip();
    ByteBuffer[] both = {len, body};
    while (body.hasRemaining() || len.hasRemaining()) {
      ch.write(both);
    }
  }

  private synchronized void holdStaging(ArrowBuf staging) {
    lastStaging = staging;
  }

  private synchronized void releaseStaging() {
    ArrowBuf s = lastStaging;
    lastStaging = null;
    if (s != null) {
      s.close();
    }
  }

  /** Ends the connection: its sessions, its staging, the socket. Idempotent. */
  void close() {
    List<Long> ids;
    synchronized (opened) {
      ids = new ArrayList<>(opened);
      opened.clear();
    }
    for (long id : ids) {
      service.close(id);
    }
    releaseStaging();
    try {
      ch.close();
    } catch (IOException e) {
      LOG.debug("closing a local connection: {}", e.toString());
    }
  }

  private static final class AuthFailure extends Exception {
    AuthFailure(String message) {
      super(message);
    }
  }
}
