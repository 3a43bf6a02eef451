package io.unstall.flight.cluster;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.hazelcast.config.Config;
import com.hazelcast.config.JoinConfig;
import com.hazelcast.config.KubernetesConfig;
import com.hazelcast.config.properties.PropertyDefinition;
import com.hazelcast.kubernetes.HazelcastKubernetesDiscoveryStrategyFactory;
import java.util.List;
import java.util.Set;
import java.util.stream.Collectors;
import org.junit.jupiter.api.Test;

/** The Hazelcast configuration a sidecar's cluster settings produce: exactly one join, the one asked for. */
class HazelcastConfigTest {
  private static final String TOKEN = "cluster-token-0123456789";

  private static ClusterSettings settings(List<String> members, String kubernetes) {
    return new ClusterSettings("unstall", "127.0.0.1", 5701, members, kubernetes, 0, TOKEN, null, null, null,
        ClusterSettings.PEER_TIMEOUT, ClusterSettings.FAILURE_TIMEOUT);
  }

  private static JoinConfig join(ClusterSettings s) {
    Config c = HazelcastCluster.config(s, "127.0.0.1:8816");
    JoinConfig j = c.getNetworkConfig().getJoin();
    j.verify(); // Hazelcast's own check: one join method enabled, not several
    assertFalse(j.getMulticastConfig().isEnabled());
    assertFalse(j.getAutoDetectionConfig().isEnabled());
    return j;
  }

  @Test
  void aListIsATcpJoinWithoutKubernetes() {
    JoinConfig j = join(settings(List.of("10.0.0.1:5701", "10.0.0.2:5701"), null));
    assertTrue(j.getTcpIpConfig().isEnabled());
    assertEquals(List.of("10.0.0.1:5701", "10.0.0.2:5701"), j.getTcpIpConfig().getMembers());
    assertFalse(j.getKubernetesConfig().isEnabled());
  }

  @Test
  void aHeadlessServicesDnsNameIsADnsLookup() {
    JoinConfig j = join(settings(List.of(), "unstall-cluster.ml.svc.cluster.local"));
    assertFalse(j.getTcpIpConfig().isEnabled());
    KubernetesConfig k = j.getKubernetesConfig();
    assertTrue(k.isEnabled());
    assertEquals("unstall-cluster.ml.svc.cluster.local", k.getProperty("service-dns"));
    assertNull(k.getProperty("service-name"));
    assertEquals("5701", k.getProperty("service-port"));
    assertKnownToThePlugin(k);
  }

  @Test
  void aBareServiceNameIsLookedUpThroughTheKubernetesApi() {
    KubernetesConfig k = join(settings(List.of(), "unstall-cluster")).getKubernetesConfig();
    assertTrue(k.isEnabled());
    assertEquals("unstall-cluster", k.getProperty("service-name"));
    assertNull(k.getProperty("service-dns"));
    assertKnownToThePlugin(k);
  }

  /** Every property set is one that Hazelcast's embedded Kubernetes discovery (in the hazelcast jar) defines. */
  private static void assertKnownToThePlugin(KubernetesConfig k) {
    Set<String> known = new HazelcastKubernetesDiscoveryStrategyFactory().getConfigurationProperties().stream()
        .map(PropertyDefinition::key).collect(Collectors.toSet());
    assertTrue(known.containsAll(k.getProperties().keySet()), k.getProperties() + " not all in " + known);
  }

  @Test
  void kubernetesTakesNoListAndNeedsAName() {
    assertThrows(IllegalArgumentException.class, () -> settings(List.of("10.0.0.1:5701"), "unstall-cluster"));
    assertThrows(IllegalArgumentException.class, () -> settings(List.of(), " "));
    assertThrows(IllegalArgumentException.class, () -> settings(List.of(), null));
  }
}
