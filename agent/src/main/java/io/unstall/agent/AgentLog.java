package io.unstall.agent;

/** The agent's own diagnostics: stderr, one line each, prefixed; never option values of secrets. */
public final class AgentLog {
  private static volatile boolean debug;

  private AgentLog() {}

  static void setDebug(boolean on) {
    debug = on;
  }

  public static void info(String message) {
    System.err.println("[unstall-agent] " + message);
  }

  public static void debug(String message) {
    if (debug) {
      info(message);
    }
  }

  public static void error(String message, Throwable t) {
    info(message + ": " + t);
    if (debug) {
      t.printStackTrace();
    }
  }
}
