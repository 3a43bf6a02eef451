package io.unstall.agent;

import java.io.File;
import java.io.FileOutputStream;
import java.io.InputStream;
import java.lang.instrument.Instrumentation;
import java.net.URL;
import java.security.CodeSource;
import java.util.jar.JarEntry;
import java.util.jar.JarFile;
import java.util.jar.JarOutputStream;

/**
 * The {@code -javaagent} entry point. It only puts the bootstrap helper classes on the bootstrap
 * class path and hands off to {@link AgentInstaller}; anything that goes wrong is reported on
 * stderr and the application starts as if the agent were absent. It keeps no state.
 */
public final class UnstallAgent {
  static final String BOOTSTRAP_PACKAGE = "io/unstall/agent/bootstrap/";

  private UnstallAgent() {}

  public static void premain(String args, Instrumentation inst) {
    start(args, inst);
  }

  public static void agentmain(String args, Instrumentation inst) {
    start(args, inst);
  }

  private static void start(String args, Instrumentation inst) {
    try {
      injectBootstrapClasses(inst);
      Class.forName("io.unstall.agent.AgentInstaller")
          .getMethod("install", String.class, Instrumentation.class)
          .invoke(null, args, inst);
    } catch (Throwable t) {
      Throwable cause = t.getCause() != null ? t.getCause() : t;
      System.err.println(
          "[unstall-agent] not started, the application runs without it: " + cause);
    }
  }

  /**
   * Copies the classes of {@code io.unstall.agent.bootstrap} from the agent jar into a small
   * temporary jar appended to the bootstrap search path. The system class loader delegates to its
   * parents first, so afterwards the agent code and the advice inlined into JDK classes see the
   * same single copy.
   */
  private static void injectBootstrapClasses(Instrumentation inst) throws Exception {
    CodeSource source = UnstallAgent.class.getProtectionDomain().getCodeSource();
    URL location = source == null ? null : source.getLocation();
    if (location == null || !location.getPath().endsWith(".jar")) {
      throw new IllegalStateException("the agent must be loaded from its jar, not " + location);
    }
    File agentJar = new File(location.toURI());
    File helperJar = File.createTempFile("unstall-bootstrap-", ".jar");
    helperJar.deleteOnExit();
    int copied = 0;
    try (JarFile in = new JarFile(agentJar);
        JarOutputStream out = new JarOutputStream(new FileOutputStream(helperJar))) {
      for (JarEntry e : java.util.Collections.list(in.entries())) {
        String name = e.getName();
        if (name.startsWith(BOOTSTRAP_PACKAGE) && name.endsWith(".class")) {
          out.putNextEntry(new JarEntry(name));
          try (InputStream is = in.getInputStream(e)) {
            is.transferTo(out);
          }
          out.closeEntry();
          copied++;
        }
      }
    }
    if (copied == 0) {
      throw new IllegalStateException("no bootstrap classes in " + agentJar);
    }
    inst.appendToBootstrapClassLoaderSearch(new JarFile(helperJar));
  }
}
