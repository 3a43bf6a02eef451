package io.unstall.flight.cluster;

import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.protocol.BatchSchema;
import io.unstall.flight.protocol.PeerTicket;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.file.Files;
import java.time.Duration;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import org.apache.arrow.flight.CallHeaders;
import org.apache.arrow.flight.CallOptions;
import org.apache.arrow.flight.FlightCallHeaders;
import org.apache.arrow.flight.FlightClient;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.flight.HeaderCallOption;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.util.AutoCloseables;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Flight clients to the other sidecars' peer ports, one per peer, opened on first use and dropped when the peer
 * leaves. Every call carries the cluster token (never a user's) and, with TLS, trusts only the cluster's CA.
 * A fetch that fails for any reason (peer gone, hung past its deadline, a reply that does not match the request)
 * returns false: the caller reads those samples from storage. Never fails a batch.
 */
public final class PeerClients implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(PeerClients.class);

  private final BufferAllocator allocator;
  private final HeaderCallOption auth;
  private final byte[] trustedCa; // null: plaintext (loopback clusters, tests)
  private final org.apache.arrow.flight.CallOption timeout;
  private final ConcurrentHashMap<String, FlightClient> clients = new ConcurrentHashMap<>();
  private final Set<String> failing = ConcurrentHashMap.newKeySet(); // warned once until the peer answers again

  /** {@code allocator} receives the peers' batches (the data plane's "peer-clients" child, which it closes). */
  public PeerClients(BufferAllocator allocator, ClusterSettings s) throws IOException {
    this.allocator = allocator;
    CallHeaders h = new FlightCallHeaders();
    h.insert("authorization", "Bearer " + s.token());
    this.auth = new HeaderCallOption(h);
    this.trustedCa = s.tls() ? Files.readAllBytes(s.tlsCa()) : null;
    Duration t = s.peerTimeout();
    this.timeout = CallOptions.timeout(t.toMillis(), TimeUnit.MILLISECONDS);
  }

  private FlightClient client(Peer p) {
    return clients.computeIfAbsent(p.address(), a -> {
      FlightClient.Builder b = FlightClient.builder(allocator, p.location(trustedCa != null));
      if (trustedCa != null) {
        b.trustedCertificates(new ByteArrayInputStream(trustedCa));
      }
      return b.build();
    });
  }

  /**
   * Asks {@code owner} for samples {@code ids} of {@code d} and copies each payload into {@code data} at
   * {@code at[i]}. True if every row arrived as asked (same ids, same lengths); false otherwise (logged once per
   * peer until it answers again), in which case some rows may have been written and must be read again.
   */
  public boolean fetch(Peer owner, Dataset d, long epoch, int[] ids, ArrowBuf data, long[] at) {
    long[] asked = new long[ids.length];
    for (int i = 0; i < ids.length; i++) {
      asked[i] = ids[i];
    }
    try (FlightStream s = client(owner).getStream(new PeerTicket(d.name(), epoch, asked).toTicket(), auth, timeout)) {
      int row = 0;
      while (s.next()) {
        VectorSchemaRoot root = s.getRoot();
        BigIntVector idVec = (BigIntVector) root.getVector(BatchSchema.ID);
        VarBinaryVector payload = (VarBinaryVector) root.getVector(BatchSchema.PAYLOAD);
        for (int r = 0; r < root.getRowCount(); r++, row++) {
          if (row >= ids.length || idVec.get(r) != ids[row] || payload.getValueLength(r) != d.length(ids[row])) {
            throw new IOException("peer " + owner.address() + " answered row " + row + " of dataset '" + d.name()
                + "' with another sample (is the dataset registered differently there?)");
          }
          data.setBytes(at[row], payload.getDataBuffer(), payload.getStartOffset(r), payload.getValueLength(r));
        }
      }
      if (row != ids.length) {
        throw new IOException("peer " + owner.address() + " sent " + row + " of " + ids.length + " samples");
      }
      if (failing.remove(owner.address())) {
        LOG.info("peer {} answers again", owner.address());
      }
      return true;
    } catch (Exception e) {
      if (failing.add(owner.address())) {
        LOG.warn("peer fetch from {} failed ({} samples of dataset '{}'); reading them from storage: {}",
            owner.address(), ids.length, d.name(), e.getMessage());
      }
      return false;
    }
  }

  /**
   * The client of the peer port at {@code hostPort} and the options of a call to it (the cluster token; no
   * deadline: the caller's calls bound their own waits), for peer calls other than fetches (remote prep workers).
   */
  public FlightClient client(String hostPort) {
    return client(Peer.parse("peer " + hostPort, hostPort));
  }

  public org.apache.arrow.flight.CallOption[] callOptions() {
    return new org.apache.arrow.flight.CallOption[] {auth};
  }

  /** Closes the client of a peer that left the cluster. */
  public void drop(Peer p) {
    FlightClient c = clients.remove(p.address());
    failing.remove(p.address());
    if (c != null) {
      try {
        c.close();
      } catch (Exception e) {
        LOG.debug("closing the client of departed peer {}: {}", p.address(), e.toString());
      }
    }
  }

  @Override
  public void close() throws Exception {
    AutoCloseables.close(clients.values());
    clients.clear();
  }
}
