package io.unstall.agent.bootstrap;

import java.util.concurrent.Callable;

/**
 * Public on-demand API for applications, reachable from any class loader because it lives in the
 * bootstrap loader. Call it reflectively so the application does not depend on the agent:
 *
 * <pre>{@code
 * Class.forName("io.unstall.agent.bootstrap.UnstallControl").getMethod("dumpProfile").invoke(null);
 * }</pre>
 */
public final class UnstallControl {
  private UnstallControl() {}

  private static volatile Callable<String> dumper;

  public static void setDumper(Callable<String> d) {
    dumper = d;
  }

  /**
   * Writes the I/O profile now and returns the path of the JSON file, or null when the agent is
   * not running or profiles are off.
   */
  public static String dumpProfile() {
    Callable<String> d = dumper;
    if (d == null) {
      return null;
    }
    IoBridge.enterAgent();
    try {
      return d.call();
    } catch (Exception e) {
      return null;
    } finally {
      IoBridge.exitAgent();
    }
  }
}
