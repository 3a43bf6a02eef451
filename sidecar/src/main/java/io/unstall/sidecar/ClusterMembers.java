package io.unstall.sidecar;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * The seed members of the cluster's TCP join, from {@code --cluster-members}: a list {@code host[:port],...}, or
 * {@code auto}: the launcher's environment, SLURM's {@code SLURM_JOB_NODELIST} (every node of the job) or
 * torchrun's {@code MASTER_ADDR} (one seed is enough to join). A host without a port gets {@code port}. Or
 * {@code k8s:SERVICE}: no list at all, Hazelcast's Kubernetes join finds the members behind that Service.
 */
final class ClusterMembers {
  static final String KUBERNETES = "k8s:";

  private ClusterMembers() {}

  /**
   * The Service of {@code k8s:SERVICE} ({@code unstall-cluster}, looked up through the Kubernetes API, or a headless
   * Service's DNS name such as {@code unstall-cluster.ml.svc.cluster.local}, resolved by DNS), or null for a list
   * or {@code auto}.
   */
  static String kubernetesService(String spec) {
    String s = spec.trim();
    if (!s.startsWith(KUBERNETES)) {
      return null;
    }
    String service = s.substring(KUBERNETES.length()).trim();
    if (service.isEmpty() || !service.matches("[a-z0-9]([-a-z0-9.]*[a-z0-9])?")) {
      throw new IllegalArgumentException("--cluster-members '" + spec + "': expected k8s:SERVICE, a Service name or its"
          + " DNS name (lower-case letters, digits, '-' and '.')");
    }
    return service;
  }

  static List<String> resolve(String spec, int port, Map<String, String> env) {
    String list = spec.trim();
    if (list.equals("auto")) {
      String slurm = env.get("SLURM_JOB_NODELIST");
      String master = env.get("MASTER_ADDR");
      if (slurm != null && !slurm.isBlank()) {
        list = String.join(",", expandSlurm(slurm));
      } else if (master != null && !master.isBlank()) {
        list = master;
      } else {
        throw new IllegalArgumentException(
            "--cluster-members auto: neither SLURM_JOB_NODELIST nor MASTER_ADDR is set; list the members");
      }
    }
    List<String> out = new ArrayList<>();
    for (String m : list.split(",")) {
      String h = m.trim();
      if (h.isEmpty()) {
        continue;
      }
      boolean hasPort = h.startsWith("[")
          ? h.contains("]:")
          : h.indexOf(':') > 0 && h.indexOf(':') == h.lastIndexOf(':');
      out.add(hasPort ? h : h + ":" + port);
    }
    if (out.isEmpty()) {
      throw new IllegalArgumentException("--cluster-members '" + spec + "' names no member");
    }
    return out;
  }

  /** Expands SLURM's compressed host list: {@code node[01-03,7],gpu5} -> node01, node02, node03, node7, gpu5. */
  static List<String> expandSlurm(String nodelist) {
    List<String> hosts = new ArrayList<>();
    int i = 0;
    while (i < nodelist.length()) {
      int end = i;
      int depth = 0;
      while (end < nodelist.length() && (depth > 0 || nodelist.charAt(end) != ',')) {
        char c = nodelist.charAt(end);
        depth += c == '[' ? 1 : c == ']' ? -1 : 0;
        end++;
      }
      String item = nodelist.substring(i, end);
      int open = item.indexOf('[');
      if (open < 0) {
        hosts.add(item);
      } else {
        if (!item.endsWith("]")) {
          throw new IllegalArgumentException("SLURM_JOB_NODELIST: cannot read '" + item + "'");
        }
        String prefix = item.substring(0, open);
        for (String range : item.substring(open + 1, item.length() - 1).split(",")) {
          int dash = range.indexOf('-');
          if (dash < 0) {
            hosts.add(prefix + range);
            continue;
          }
          String lo = range.substring(0, dash);
          int from = Integer.parseInt(lo);
          int to = Integer.parseInt(range.substring(dash + 1));
          for (int n = from; n <= to; n++) {
            hosts.add(prefix + String.format("%0" + lo.length() + "d", n));
          }
        }
      }
      i = end + 1;
    }
    return hosts;
  }
}
