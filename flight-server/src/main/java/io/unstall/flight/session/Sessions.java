package io.unstall.flight.session;

import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.dataset.Dataset;
import java.util.ArrayDeque;
import java.util.Deque;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;
import java.util.function.Consumer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The open fetch sessions, by id, and the last closed ones (their counters stay visible in stats). Ids are
 * random 63-bit numbers, so a stale id from a restarted sidecar is unknown rather than someone else's.
 */
public final class Sessions {
  private static final Logger LOG = LoggerFactory.getLogger(Sessions.class);
  public static final int MAX_OPEN = 4096;
  private static final int KEEP_CLOSED = 64;

  private final Map<Long, FetchSession> open = new ConcurrentHashMap<>();
  private final Deque<FetchSession> closed = new ArrayDeque<>(); // guarded by itself
  private final Consumer<FetchSession> onClose;

  /** {@code onClose} frees what a session held (its prefetch plan and staging). */
  public Sessions(Consumer<FetchSession> onClose) {
    this.onClose = onClose;
  }

  public FetchSession open(Dataset d, String name, String transport) {
    if (open.size() >= MAX_OPEN) {
      throw new TooManySessionsException(
          "the sidecar has " + open.size() + " open sessions (at most " + MAX_OPEN + "); close finished DataLoaders");
    }
    while (true) {
      long id = ThreadLocalRandom.current().nextLong(1, Long.MAX_VALUE);
      FetchSession s = new FetchSession(id, d, name, transport);
      if (open.putIfAbsent(id, s) == null) {
        LOG.info("session {} opened: dataset '{}', {} ({})", id, d.name(), name, transport);
        return s;
      }
    }
  }

  /** The open session {@code id}; an unknown one is an error naming it. */
  public FetchSession get(long id) {
    FetchSession s = open.get(id);
    if (s == null) {
      throw new UnknownSessionException(
          "unknown session " + Long.toUnsignedString(id)
              + " (closed, or opened on a sidecar that has since restarted)");
    }
    return s;
  }

  public void close(long id) {
    FetchSession s = open.remove(id);
    if (s == null) {
      return;
    }
    s.markClosed();
    onClose.accept(s);
    synchronized (closed) {
      closed.addLast(s);
      while (closed.size() > KEEP_CLOSED) {
        closed.removeFirst();
      }
    }
  }

  /** {@code {"<id>": {"dataset","name","transport","open","epochs","total"}}}: open and recently closed. */
  public ObjectNode toJson() {
    ObjectNode o = JsonNodeFactory.instance.objectNode();
    synchronized (closed) {
      for (FetchSession s : closed) {
        o.set(Long.toUnsignedString(s.id()), s.toJson());
      }
    }
    for (FetchSession s : open.values()) {
      o.set(Long.toUnsignedString(s.id()), s.toJson());
    }
    return o;
  }

  /** An unknown session id: NOT_FOUND. */
  public static final class UnknownSessionException extends RuntimeException {
    UnknownSessionException(String message) {
      super(message);
    }
  }

  /** Too many open sessions: RESOURCE_EXHAUSTED. */
  public static final class TooManySessionsException extends RuntimeException {
    TooManySessionsException(String message) {
      super(message);
    }
  }
}
