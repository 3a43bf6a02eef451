package io.unstall.flight.cluster;

import com.hazelcast.cluster.Member;
import com.hazelcast.cluster.MembershipEvent;
import com.hazelcast.cluster.MembershipListener;
import com.hazelcast.config.Config;
import com.hazelcast.config.JoinConfig;
import com.hazelcast.config.NetworkConfig;
import com.hazelcast.core.Hazelcast;
import com.hazelcast.core.HazelcastInstance;
import com.hazelcast.partition.Partition;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Consumer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The sidecar's embedded Hazelcast member: membership, failure detection and partition ownership come from
 * Hazelcast, none of it is written here. A sample's key is (dataset name, sample id): ids are known before the
 * bytes, so the owner can be asked first. Hazelcast's partition service maps the key to one of its partitions
 * and the partition to its owner; the owner's member attribute {@value #PEER_ATTRIBUTE} holds its peer port's
 * address. When a member leaves or dies, Hazelcast reassigns its partitions to the survivors (their caches refill
 * from storage) and {@code departed} is told, so its peer client is dropped. No data goes into Hazelcast's maps:
 * payloads move over Flight ({@link PeerClients}).
 */
public final class HazelcastCluster implements Ownership, AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(HazelcastCluster.class);
  public static final String PEER_ATTRIBUTE = "unstall.peer";

  private final HazelcastInstance hz;
  private final Partition[] partitions; // by partition id
  private final int stride; // coprime to the partition count: every partition is dealt ids
  /** Each member's peer, parsed once (ownerOf runs per sample); a departed member's entry is dropped. */
  private final ConcurrentHashMap<UUID, Peer> peers = new ConcurrentHashMap<>();

  private HazelcastCluster(HazelcastInstance hz) {
    this.hz = hz;
    Partition[] ps = new Partition[hz.getPartitionService().getPartitions().size()];
    for (Partition p : hz.getPartitionService().getPartitions()) {
      ps[p.getPartitionId()] = p; // live views: their owner follows migrations
    }
    this.partitions = ps;
    this.stride = ps.length % 97 == 0 ? 1 : 97; // 97 is prime: coprime to any count it does not divide
  }

  /**
   * Joins (or founds) the cluster of {@code s}, publishing {@code peerAddress} ({@code host:port} of this sidecar's
   * peer port); {@code departed} gets the peer address of every member that leaves.
   */
  public static HazelcastCluster join(ClusterSettings s, String peerAddress, Consumer<Peer> departed) {
    HazelcastInstance hz = Hazelcast.newHazelcastInstance(config(s, peerAddress));
    HazelcastCluster c = new HazelcastCluster(hz);
    hz.getCluster().addMembershipListener(new MembershipListener() {
      @Override
      public void memberAdded(MembershipEvent e) {
        LOG.info("cluster '{}': {} joined; {} members", s.name(), describe(e.getMember()), e.getMembers().size());
      }

      @Override
      public void memberRemoved(MembershipEvent e) {
        LOG.warn("cluster '{}': {} left; its partitions go to the {} remaining members, which read them from storage",
            s.name(), describe(e.getMember()), e.getMembers().size());
        c.peers.remove(e.getMember().getUuid());
        Peer p = peerOf(e.getMember());
        if (p != null) {
          departed.accept(p);
        }
      }
    });
    LOG.info("cluster '{}': joined as {} (peer port {}); {} members", s.name(),
        hz.getCluster().getLocalMember().getAddress(), peerAddress, hz.getCluster().getMembers().size());
    return c;
  }

  /** Hazelcast kept to membership and ownership: no multicast, no phone-home, few threads, quiet logs. */
  static Config config(ClusterSettings s, String peerAddress) {
    Config c = new Config();
    c.setClusterName(s.name());
    c.setInstanceName("unstall-" + ProcessHandle.current().pid() + "-" + s.port());
    c.setProperty("hazelcast.phone.home.enabled", "false");
    c.setProperty("hazelcast.logging.type", "slf4j");
    c.setProperty("hazelcast.shutdownhook.enabled", "false"); // the sidecar leaves when it closes
    c.setProperty("hazelcast.socket.bind.any", "false");
    c.setProperty("hazelcast.heartbeat.interval.seconds", "1");
    c.setProperty("hazelcast.max.no.heartbeat.seconds", Long.toString(s.failureTimeout().toSeconds()));
    c.setProperty("hazelcast.graceful.shutdown.max.wait", "10");
    // It runs beside a trainer, on laptops with 2 cores too: a handful of threads.
    c.setProperty("hazelcast.partition.operation.thread.count", "2");
    c.setProperty("hazelcast.operation.generic.thread.count", "1");
    c.setProperty("hazelcast.io.thread.count", "1");
    c.setProperty("hazelcast.event.thread.count", "1");
    c.setProperty("hazelcast.clientengine.thread.count", "1");
    c.getJetConfig().setEnabled(false);
    c.getMemberAttributeConfig().setAttribute(PEER_ATTRIBUTE, peerAddress);
    NetworkConfig n = c.getNetworkConfig();
    n.setPort(s.port()).setPortAutoIncrement(false);
    // Exactly the cluster address (not an interface match: 127.0.0.x beside 127.0.0.1 is no interface's address).
    // Hazelcast reads it as a JVM property: one member per sidecar process.
    System.setProperty("hazelcast.local.localAddress", s.bind());
    JoinConfig j = n.getJoin();
    j.getMulticastConfig().setEnabled(false);
    j.getAutoDetectionConfig().setEnabled(false);
    if (s.kubernetesService() != null) {
      // Hazelcast's own Kubernetes join: the members are the addresses behind a (headless) Service.
      String svc = s.kubernetesService();
      j.getTcpIpConfig().setEnabled(false);
      j.getKubernetesConfig().setEnabled(true)
          .setProperty(svc.indexOf('.') >= 0 ? "service-dns" : "service-name", svc)
          .setProperty("service-port", Integer.toString(s.port()));
    } else {
      j.getTcpIpConfig().setEnabled(true).setMembers(s.members());
    }
    return c;
  }

  @Override
  public Peer ownerOf(String dataset, int id) {
    Member owner = partitionOf(dataset, id).getOwner();
    if (owner == null) {
      return Peer.UNDECIDED;
    }
    if (owner.localMember()) {
      return Peer.SELF;
    }
    Peer peer = peers.get(owner.getUuid());
    if (peer == null) {
      peer = peerOf(owner);
      if (peer == null) {
        return Peer.UNDECIDED;
      }
      peers.put(owner.getUuid(), peer);
    }
    return peer;
  }

  /**
   * Sample {@code id}'s partition: the dataset's ids dealt over the partitions from a starting point of its name,
   * in steps of 97 (coprime to the prime 271, Hazelcast's default partition count), so each partition gets an
   * even share of every dataset (to within one sample), and each member by the partitions it owns; the stride
   * scatters neighbouring ids over the partition table, which Hazelcast assigns to members in runs, so a small
   * dataset is spread as well. Hashing each id instead leaves members with uneven shares, and the most loaded
   * member's storage link and cache set the pace.
   */
  Partition partitionOf(String dataset, int id) {
    Partition[] ps = partitions;
    int start = Math.floorMod(dataset.hashCode() * 0x9E3779B9, ps.length);
    return ps[(int) ((start + (long) id * stride) % ps.length)];
  }

  private static Peer peerOf(Member m) {
    String address = m.getAttribute(PEER_ATTRIBUTE);
    if (address == null) {
      return null; // a member that is not an unstall sidecar (another cluster's misconfiguration): never asked
    }
    return Peer.parse(m.getUuid().toString(), address);
  }

  private static String describe(Member m) {
    return "member " + m.getAddress() + " (peer " + m.getAttribute(PEER_ATTRIBUTE) + ")";
  }

  /** The cluster's directory of prep groups that take remote prep workers; {@code self}: this peer address. */
  public PrepDirectory prepDirectory(String self) {
    return new PrepDirectory(hz.getReplicatedMap(PrepDirectory.MAP), self);
  }

  /** Members the cluster has now, this one included. */
  public int members() {
    return hz.getCluster().getMembers().size();
  }

  /** Whether every partition has an owner and no migration is under way. */
  public boolean settled() {
    return hz.getPartitionService().isClusterSafe();
  }

  /** Drops out without a goodbye, as a crashed node would: the others find out by its silence (tests). */
  public void terminate() {
    hz.getLifecycleService().terminate();
  }

  /** Leaves the cluster: the others take over this member's partitions. */
  @Override
  public void close() {
    hz.shutdown();
  }
}
