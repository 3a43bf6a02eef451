package io.unstall.flight.local;

import io.unstall.flight.protocol.LocalFrames;
import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.ClosedChannelException;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.nio.file.attribute.UserPrincipal;
import java.util.Set;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import jdk.net.ExtendedSocketOptions;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The same-host data plane: a Unix socket (mode 0600 in the sidecar's 0700 shared-memory directory) where
 * clients on this host fetch batches as references into shared memory ({@code UNSL}, protocol/README.md).
 * It is the owner's alone: the directory lets only the sidecar's user reach the socket, a connection from any
 * other uid (root, say) is refused by its SO_PEERCRED, and then HELLO must carry the owner's token. Tenants
 * use Flight. One thread per connection (a DataLoader worker holds one connection and has one request in flight), from
 * a pool of at most {@code maxConnections} ({@code --local-connections}): a connection beyond that is
 * answered RESOURCE_EXHAUSTED, naming the option, and closed.
 */
public final class LocalServer implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(LocalServer.class);

  private final Path path;
  private final ServerSocketChannel server;
  private final LocalService service;
  private final int maxConnections;
  private final Set<LocalConnection> connections = ConcurrentHashMap.newKeySet();
  private final ThreadPoolExecutor threads;
  private final Thread acceptor;
  private final UserPrincipal owner; // the sidecar's user: the owner of the socket file it just made
  private volatile boolean closed;

  public LocalServer(Path path, LocalService service, int maxConnections) throws IOException {
    this.path = path;
    this.service = service;
    this.maxConnections = maxConnections;
    AtomicInteger n = new AtomicInteger();
    // Admission (the connection count) keeps the queue to the odd connection whose thread is just finishing.
    this.threads = new ThreadPoolExecutor(maxConnections, maxConnections, 60, TimeUnit.SECONDS,
        new ArrayBlockingQueue<>(maxConnections), r -> {
          Thread t = new Thread(r, "unstall-local-" + n.incrementAndGet());
          t.setDaemon(true);
          return t;
        });
    threads.allowCoreThreadTimeOut(true);
    Files.deleteIfExists(path);
    this.server = ServerSocketChannel.open(StandardProtocolFamily.UNIX);
    server.bind(UnixDomainSocketAddress.of(path));
    Files.setPosixFilePermissions(path, PosixFilePermissions.fromString("rw-------"));
    this.owner = Files.getOwner(path);
    this.acceptor = new Thread(this::acceptLoop, "unstall-local-accept");
    acceptor.setDaemon(true);
  }

  public LocalServer start() {
    acceptor.start();
    return this;
  }

  public Path path() {
    return path;
  }

  private void acceptLoop() {
    while (!closed) {
      SocketChannel ch;
      try {
        ch = server.accept();
      } catch (ClosedChannelException e) {
        return;
      } catch (IOException e) {
        if (!closed) {
          LOG.warn("local data plane: accept failed: {}", e.toString());
        }
        continue;
      }
      String stranger = stranger(ch);
      if (stranger != null) {
        LOG.warn("local data plane: refused a connection from user {} (the socket is {}'s)", stranger, owner.getName());
        LocalConnection.refuse(ch, LocalFrames.UNAUTHENTICATED, "the sidecar's local socket is for its own user ("
            + owner.getName() + "), not " + stranger + "; other users read over Flight with a tenant token");
        continue;
      }
      if (connections.size() >= maxConnections) {
        LocalConnection.refuse(ch, LocalFrames.RESOURCE_EXHAUSTED, "the sidecar already serves " + maxConnections
            + " local connections (one thread each); close idle clients, or raise --local-connections");
        continue;
      }
      LocalConnection c = new LocalConnection(ch, service, connections::remove);
      connections.add(c);
      try {
        threads.execute(c);
      } catch (java.util.concurrent.RejectedExecutionException e) { // stopping
        connections.remove(c);
        c.close();
      }
    }
  }

  /** Connections open now. */
  public int connections() {
    return connections.size();
  }

  /** The peer's user when it is not the sidecar's (null: the owner, or a platform without SO_PEERCRED). */
  private String stranger(SocketChannel ch) {
    try {
      UserPrincipal peer = ch.getOption(ExtendedSocketOptions.SO_PEERCRED).user();
      return peer.equals(owner) ? null : peer.getName();
    } catch (UnsupportedOperationException | IOException e) {
      return null; // the 0700 directory still keeps other users out
    }
  }

  /** Stops accepting, closes every connection (their sessions and staging), removes the socket file. */
  @Override
  public void close() throws IOException {
    closed = true;
    server.close();
    for (LocalConnection c : connections) {
      c.close();
    }
    // A request in progress finishes (its staging freed on the way out) before the allocators close.
    threads.shutdown();
    try {
      if (!threads.awaitTermination(10, TimeUnit.SECONDS)) {
        LOG.warn("local data plane: {} connections still busy after 10 s; closing anyway", connections.size());
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
    Files.deleteIfExists(path);
  }
}
