package io.unstall.sidecar;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** --cluster-members: a list, or the launcher's environment (SLURM, torchrun). */
class ClusterMembersTest {
  @Test
  void aListGetsTheDefaultPortWhereItHasNone() {
    assertEquals(List.of("10.0.0.1:5701", "10.0.0.2:6000", "[fe80::1]:5701"),
        ClusterMembers.resolve("10.0.0.1, 10.0.0.2:6000,[fe80::1]:5701", 5701, Map.of()));
  }

  @Test
  void autoExpandsSlurmsNodelistBeforeMasterAddr() {
    assertEquals(List.of("node01:5701", "node02:5701", "node03:5701", "node7:5701", "gpu5:5701"),
        ClusterMembers.resolve("auto", 5701, Map.of("SLURM_JOB_NODELIST", "node[01-03,7],gpu5", "MASTER_ADDR", "x")));
    assertEquals(List.of("10.1.2.3:5701"), ClusterMembers.resolve("auto", 5701, Map.of("MASTER_ADDR", "10.1.2.3")));
  }

  @Test
  void k8sNamesAServiceInsteadOfAList() {
    assertEquals("unstall-cluster", ClusterMembers.kubernetesService("k8s:unstall-cluster"));
    assertEquals("unstall-cluster.ml.svc.cluster.local",
        ClusterMembers.kubernetesService(" k8s:unstall-cluster.ml.svc.cluster.local "));
    assertNull(ClusterMembers.kubernetesService("10.0.0.1,10.0.0.2"));
    assertNull(ClusterMembers.kubernetesService("auto"));
    for (String bad : new String[] {"k8s:", "k8s:Unstall", "k8s:a,b", "k8s:-x"}) {
      IllegalArgumentException e =
          assertThrows(IllegalArgumentException.class, () -> ClusterMembers.kubernetesService(bad), bad);
      assertTrue(e.getMessage().contains("expected k8s:SERVICE"), e.getMessage());
    }
  }

  @Test
  void autoWithoutALauncherSaysWhatIsMissing() {
    IllegalArgumentException e =
        assertThrows(IllegalArgumentException.class, () -> ClusterMembers.resolve("auto", 5701, Map.of()));
    assertTrue(e.getMessage().contains("neither SLURM_JOB_NODELIST nor MASTER_ADDR"), e.getMessage());
  }
}
