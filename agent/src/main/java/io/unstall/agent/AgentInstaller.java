package io.unstall.agent;

import static net.bytebuddy.matcher.ElementMatchers.nameContains;
import static net.bytebuddy.matcher.ElementMatchers.nameStartsWith;

import io.opentelemetry.sdk.OpenTelemetrySdk;
import io.opentelemetry.sdk.autoconfigure.AutoConfiguredOpenTelemetrySdk;
import io.opentelemetry.sdk.trace.export.SimpleSpanProcessor;
import io.unstall.agent.bootstrap.IoBridge;
import io.unstall.agent.bootstrap.Sink;
import io.unstall.agent.bootstrap.UnstallControl;
import io.unstall.agent.instrument.IteratorInstrumentation;
import io.unstall.agent.instrument.FileIoInstrumentation;
import io.unstall.agent.profile.ProfileWriter;
import io.unstall.agent.trace.GuardedSpanExporter;
import io.unstall.agent.trace.JsonLinesSpanExporter;
import io.unstall.agent.trace.StallAttributes;
import io.unstall.agent.trace.StallTracer;
import java.io.File;
import java.lang.instrument.Instrumentation;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import net.bytebuddy.agent.builder.AgentBuilder;
import net.bytebuddy.description.type.TypeDescription;
import net.bytebuddy.dynamic.DynamicType;
import net.bytebuddy.utility.JavaModule;

/**
 * Wires the agent together, in this order: exclusions, the OpenTelemetry SDK and the stall sink,
 * the profile writer, then the Byte Buddy transformations (so nothing the set-up reads is
 * recorded), and one shutdown hook that writes the profile and flushes spans.
 */
public final class AgentInstaller {
  /** Files that are not training data: the JDK, jars and classes, and kernel pseudo files. */
  static final String[] DEFAULT_EXCLUDED_SUFFIXES = {".jar", ".jmod", ".class", ".so"};

  private static final AtomicBoolean INSTALLED = new AtomicBoolean();

  private AgentInstaller() {}

  public static void install(String args, Instrumentation inst) {
    if (!INSTALLED.compareAndSet(false, true)) {
      AgentLog.info("already installed; ignoring the second -javaagent");
      return;
    }
    long startMillis = System.currentTimeMillis();
    AgentOptions options = AgentOptions.parse(args);
    AgentLog.setDebug(options.debug());
    configureExclusions(options);

    OpenTelemetrySdk sdk = options.tracing() ? startSdk(options) : null;
    AgentLog.debug("OpenTelemetry: " + sdk);
    Sink sink =
        sdk == null
            ? (it, m, s, d, w, p, e) -> {}
            : new StallTracer(sdk.getTracer(StallAttributes.SCOPE, version()), options.failAtStall());
    ProfileWriter profile =
        options.profile() == null ? null : new ProfileWriter(options.profile(), startMillis);

    IoBridge.start(sink, (where, t) -> AgentLog.error(
        "internal failure in " + where + "; instrumentation is now off, the application continues",
        t));

    AgentBuilder agent =
        new AgentBuilder.Default()
            .disableClassFormatChanges()
            .with(AgentBuilder.RedefinitionStrategy.RETRANSFORMATION)
            .with(AgentBuilder.InitializationStrategy.NoOp.INSTANCE)
            .with(AgentBuilder.TypeStrategy.Default.REDEFINE)
            .with(new FailureListener())
            // Not the default ignore: that one skips the bootstrap loader and so the JDK readers.
            .ignore(
                isAgentClass()
                    .or(nameStartsWith("jdk.internal.reflect."))
                    .or(nameStartsWith("sun.reflect."))
                    .or(nameContains("$$Lambda")));
    if (options.io()) {
      agent = FileIoInstrumentation.apply(agent);
    }
    List<String> methods = options.allMethods();
    if (!methods.isEmpty()) {
      agent = IteratorInstrumentation.apply(agent, methods);
    }
    agent.installOn(inst);

    if (profile != null) {
      UnstallControl.setDumper(profile::write);
      if (options.profileIntervalSeconds() > 0) {
        schedule(profile, options.profileIntervalSeconds());
      }
    }
    Runtime.getRuntime()
        .addShutdownHook(new Thread(() -> shutdown(profile, sdk), "unstall-agent-shutdown"));
    AgentLog.debug(
        "started in " + (System.currentTimeMillis() - startMillis) + " ms; methods " + methods);
  }

  private static void configureExclusions(AgentOptions options) {
    List<String> prefixes = new ArrayList<>();
    List<String> suffixes = new ArrayList<>(List.of(DEFAULT_EXCLUDED_SUFFIXES));
    prefixes.add(new File(System.getProperty("java.home")).getAbsolutePath() + File.separator);
    prefixes.add("/proc/");
    prefixes.add("/sys/");
    prefixes.add("/dev/");
    for (String e : options.excludes()) {
      if (e.startsWith("*")) {
        suffixes.add(e.substring(1));
      } else {
        prefixes.add(new File(e).getAbsolutePath());
      }
    }
    IoBridge.configure(prefixes.toArray(new String[0]), suffixes.toArray(new String[0]));
  }

  private static OpenTelemetrySdk startSdk(AgentOptions options) {
    Map<String, String> defaults = new HashMap<>();
    // The agent only produces traces; metrics and logs exporters stay off unless asked for.
    defaults.put("otel.metrics.exporter", "none");
    defaults.put("otel.logs.exporter", "none");
    // The OTLP default of the specification (port 4318); grpc (4317) on request.
    defaults.put("otel.exporter.otlp.protocol", "http/protobuf");
    defaults.putAll(options.otelProperties());
    String spansFile = options.spansFile();
    return AutoConfiguredOpenTelemetrySdk.builder()
        .addPropertiesSupplier(() -> defaults)
        .addSpanExporterCustomizer((exporter, config) -> new GuardedSpanExporter(exporter))
        .addTracerProviderCustomizer(
            (builder, config) -> {
              if (spansFile != null) {
                try {
                  builder.addSpanProcessor(
                      SimpleSpanProcessor.create(
                          new GuardedSpanExporter(new JsonLinesSpanExporter(spansFile))));
                } catch (java.io.IOException e) {
                  AgentLog.error("cannot write spans.file " + spansFile, e);
                }
              }
              return builder;
            })
        .disableShutdownHook()
        .build()
        .getOpenTelemetrySdk();
  }

  private static void schedule(ProfileWriter profile, long seconds) {
    ScheduledExecutorService ses =
        Executors.newSingleThreadScheduledExecutor(
            r -> {
              Thread t = new Thread(r, "unstall-agent-profile");
              t.setDaemon(true);
              return t;
            });
    ses.scheduleAtFixedRate(
        () -> {
          IoBridge.enterAgent();
          try {
            profile.write();
          } catch (Exception e) {
            AgentLog.error("cannot write the I/O profile", e);
          } finally {
            IoBridge.exitAgent();
          }
        },
        seconds,
        seconds,
        TimeUnit.SECONDS);
  }

  private static void shutdown(ProfileWriter profile, OpenTelemetrySdk sdk) {
    IoBridge.enterAgent();
    try {
      // Pending reads of every thread, and bursts of writes still open (the last checkpoint).
      IoBridge.flushThreads(true);
      if (profile != null) {
        try {
          AgentLog.info("I/O profile written to " + profile.write());
        } catch (Exception e) {
          AgentLog.error("cannot write the I/O profile", e);
        }
      }
      IoBridge.stop();
      if (sdk != null) {
        sdk.shutdown().join(10, TimeUnit.SECONDS);
      }
    } catch (Throwable t) {
      AgentLog.error("shutdown failed", t);
    } finally {
      IoBridge.exitAgent();
    }
  }

  /** The agent's own packages (its tests and other io.unstall code stay instrumentable). */
  static net.bytebuddy.matcher.ElementMatcher.Junction<TypeDescription> isAgentClass() {
    return nameStartsWith("io.unstall.agent.bootstrap.")
        .or(nameStartsWith("io.unstall.agent.shaded."))
        .or(nameStartsWith("io.unstall.agent.instrument."))
        .or(nameStartsWith("io.unstall.agent.trace."))
        .or(nameStartsWith("io.unstall.agent.profile."))
        .or(net.bytebuddy.matcher.ElementMatchers.nameMatches("io\\.unstall\\.agent\\.[^.]+"));
  }

  static String version() {
    String v = AgentInstaller.class.getPackage().getImplementationVersion();
    return v == null ? "dev" : v;
  }

  /** Logs transformation failures of the JDK readers (others only with debug=true). */
  static final class FailureListener extends AgentBuilder.Listener.Adapter {
    @Override
    public void onError(
        String typeName,
        ClassLoader classLoader,
        JavaModule module,
        boolean loaded,
        Throwable throwable) {
      if (typeName.startsWith("java.") || typeName.startsWith("sun.nio.")) {
        AgentLog.error("cannot instrument " + typeName, throwable);
      } else {
        AgentLog.debug("cannot instrument " + typeName + ": " + throwable);
      }
    }

    @Override
    public void onTransformation(
        TypeDescription type,
        ClassLoader loader,
        JavaModule module,
        boolean loaded,
        DynamicType dynamicType) {
      AgentLog.debug("instrumented " + type.getName());
    }
  }
}
