package io.unstall.sidecar;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import picocli.CommandLine;
import picocli.CommandLine.Command;
import picocli.CommandLine.Model.OptionSpec;

/** {@code unstall-sidecar}: the process that runs beside the trainer. */
@Command(
    name = "unstall-sidecar",
    mixinStandardHelpOptions = true,
    versionProvider = Main.Version.class,
    description = "Serves training datasets over Arrow Flight through a never-evict cache.",
    subcommands = {ServeCommand.class, TokenCommand.class})
public final class Main implements Runnable {
  static {
    // Before any logger exists: concise logs on stderr, quiet libraries.
    setDefault("org.slf4j.simpleLogger.logFile", "System.err");
    setDefault("org.slf4j.simpleLogger.showDateTime", "true");
    setDefault("org.slf4j.simpleLogger.dateTimeFormat", "yyyy-MM-dd'T'HH:mm:ss.SSS");
    setDefault("org.slf4j.simpleLogger.showThreadName", "false");
    setDefault("org.slf4j.simpleLogger.showShortLogName", "true");
    setDefault("org.slf4j.simpleLogger.levelInBrackets", "true");
    setDefault("org.slf4j.simpleLogger.log.org.apache.arrow", "warn");
    setDefault("org.slf4j.simpleLogger.log.io.netty", "warn");
    setDefault("org.slf4j.simpleLogger.log.io.grpc", "warn");
    // The partitioned cache's Hazelcast member: its banner and chatter stay out; a member's loss is ours to log.
    setDefault("org.slf4j.simpleLogger.log.com.hazelcast", "error");
    java.util.logging.Logger.getLogger("py4j").setLevel(java.util.logging.Level.WARNING);
  }

  private static void setDefault(String key, String value) {
    if (System.getProperty(key) == null) {
      System.setProperty(key, value);
    }
  }

  @Override
  public void run() {
    new CommandLine(this).usage(System.err);
  }

  public static void main(String[] args) {
    System.exit(run(args));
  }

  /** Runs the CLI and returns the exit code: 0 ok, 2 bad usage or config, 3 could not start. */
  public static int run(String... args) {
    CommandLine cli = new CommandLine(new Main());
    cli.setExecutionExceptionHandler(
        (e, cmd, parsed) -> {
          cmd.getErr().println(cmd.getCommandName() + ": " + e.getMessage());
          return e instanceof IllegalArgumentException ? 2 : 3;
        });
    try {
      applyConfigFile(cli, args);
    } catch (IllegalArgumentException | IOException e) {
      System.err.println("unstall-sidecar: " + e.getMessage());
      return 2;
    }
    return cli.execute(args);
  }

  /**
   * {@code --config FILE}: a properties file whose keys are the long option names of the subcommand without
   * dashes ({@code cache-capacity=4GiB}). Command-line options override it. Unknown keys are an error.
   */
  private static void applyConfigFile(CommandLine cli, String[] args) throws IOException {
    String file = null;
    String sub = null;
    for (int i = 0; i < args.length; i++) {
      if (sub == null && cli.getSubcommands().containsKey(args[i])) {
        sub = args[i];
      } else if (args[i].equals("--config") && i + 1 < args.length) {
        file = args[i + 1];
      } else if (args[i].startsWith("--config=")) {
        file = args[i].substring("--config=".length());
      }
    }
    if (file == null || sub == null) {
      return;
    }
    Path path = Path.of(file);
    if (!Files.isRegularFile(path)) {
      throw new IllegalArgumentException("config file " + path.toAbsolutePath() + " does not exist");
    }
    Properties props = new Properties();
    try (InputStream in = Files.newInputStream(path)) {
      props.load(in);
    }
    CommandLine subCli = cli.getSubcommands().get(sub);
    Set<String> known = new TreeSet<>();
    for (OptionSpec o : subCli.getCommandSpec().options()) {
      known.add(o.longestName().replaceFirst("^--", ""));
    }
    known.remove("config");
    known.remove("help");
    known.remove("version");
    for (String key : props.stringPropertyNames()) {
      if (!known.contains(key)) {
        throw new IllegalArgumentException(
            "unknown option '" + key + "' in config file " + path + "; known options: " + String.join(", ", known));
      }
    }
    // Picocli falls back to the annotation's default (and its ${env:...}) when this returns null.
    subCli.setDefaultValueProvider(
        arg -> arg instanceof OptionSpec o ? props.getProperty(o.longestName().replaceFirst("^--", "")) : null);
  }

  /** The version from the jar manifest. */
  static final class Version implements CommandLine.IVersionProvider {
    @Override
    public String[] getVersion() {
      String v = Main.class.getPackage().getImplementationVersion();
      return new String[] {"unstall-sidecar " + (v == null ? "dev" : v) + ", wire protocol 1"};
    }
  }
}
