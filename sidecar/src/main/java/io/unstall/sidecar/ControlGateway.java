package io.unstall.sidecar;

import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.IOException;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.net.InetAddress;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.TreeSet;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import py4j.GatewayServer;
import py4j.Protocol;
import py4j.commands.AbstractCommand;
import py4j.commands.Command;

/**
 * The Py4J control plane, limited to what the shim needs: calls of the entry point's own public methods
 * ({@link ControlPlane}) with string, number, boolean or null arguments, the stack trace of an exception one of
 * them threw, and freeing such references. Everything else Py4J offers is refused with an error naming it:
 * reflection ({@code gateway.jvm...}, {@code entry_point.getClass()}, calls on any other object or class),
 * constructors, fields, arrays, lists, JVM views, help pages, streams, and stopping the gateway. A token holder
 * can therefore do what the entry point does, and nothing else as the sidecar's user.
 */
public final class ControlGateway {
  private static final Logger LOG = LoggerFactory.getLogger(ControlGateway.class);

  private ControlGateway() {}

  /** The gateway server on loopback {@code port} (0: a free one), accepting only {@code token}. */
  static GatewayServer build(Object entryPoint, String token, int port) {
    List<Class<? extends Command>> commands = List.of(
        EntryPointCall.class, Reflection.class, Constructor.class, Field.class, Arrays.class, Lists.class,
        JvmView.class, Help.class, Dir.class, Stream.class, Shutdown.class);
    return new GatewayServer.GatewayServerBuilder(entryPoint)
        .javaAddress(InetAddress.getLoopbackAddress())
        .javaPort(port)
        .authToken(token)
        .customCommands(commands)
        .build();
  }

  /** The entry point's callable methods: public, declared by its own class. */
  static Set<String> methodsOf(Class<?> c) {
    Set<String> names = new TreeSet<>();
    for (Method m : c.getDeclaredMethods()) {
      if (Modifier.isPublic(m.getModifiers()) && !Modifier.isStatic(m.getModifiers()) && !m.isSynthetic()) {
        names.add(m.getName());
      }
    }
    return names;
  }

  /** Py4J's call command ({@code c}), for the entry point's declared methods only. */
  public static final class EntryPointCall extends AbstractCommand {
    private static final String ARGUMENT_TYPES = "siLdbn"; // string, int, long, double, boolean, null
    private Set<String> methods;

    public EntryPointCall() {
      this.commandName = "c";
    }

    @Override
    public void execute(String name, BufferedReader reader, BufferedWriter writer) throws IOException {
      String target = reader.readLine();
      String method = reader.readLine();
      List<String> raw = getStringArguments(reader);
      String refused = refusal(target, method, raw);
      String reply;
      if (refused != null) {
        LOG.warn("control plane: refused {}", refused);
        reply = Protocol.getOutputErrorCommand("control plane: refused " + refused);
      } else {
        List<Object> args = new ArrayList<>(raw.size());
        for (String a : raw) {
          args.add(Protocol.getObject(a, gateway));
        }
        reply = Protocol.getOutputCommand(invokeMethod(method, target, args));
      }
      writer.write(reply);
      writer.flush();
    }

    private String refusal(String target, String method, List<String> args) {
      if (methods == null) {
        methods = methodsOf(gateway.getEntryPoint().getClass());
      }
      if (!Protocol.ENTRY_POINT_OBJECT_ID.equals(target)) {
        return "a call of " + method + " on " + describe(target)
            + ": only the entry point's methods may be called (" + String.join(", ", methods) + ")";
      }
      if (!methods.contains(method)) {
        return "'" + method + "': not a control-plane method (" + String.join(", ", methods) + ")";
      }
      for (String a : args) {
        if (a.isEmpty() || ARGUMENT_TYPES.indexOf(a.charAt(0)) < 0) {
          return "a call of " + method + " with an object argument: arguments are strings, numbers or booleans";
        }
      }
      return null;
    }

    private static String describe(String target) {
      if (target != null && target.startsWith(Protocol.STATIC_PREFIX)) {
        return "class " + target.substring(Protocol.STATIC_PREFIX.length());
      }
      return "object " + target;
    }
  }

  /** A Py4J command the control plane does not offer: the rest of it is read, and an error names it. */
  abstract static class Refused extends AbstractCommand {
    private final String what;

    Refused(String name, String what) {
      this.commandName = name;
      this.what = what;
    }

    @Override
    public void execute(String name, BufferedReader reader, BufferedWriter writer) throws IOException {
      String line = reader.readLine();
      while (line != null && !Protocol.isEnd(line)) {
        line = reader.readLine();
      }
      LOG.warn("control plane: refused {}", what);
      writer.write(Protocol.getOutputErrorCommand("control plane: refused " + what
          + "; the sidecar's control plane offers its entry point's methods only"));
      writer.flush();
    }
  }

  public static final class Reflection extends Refused {
    public Reflection() {
      super("r", "reflection (JVM classes and packages)");
    }
  }

  public static final class Constructor extends Refused {
    public Constructor() {
      super("i", "a constructor call");
    }
  }

  public static final class Field extends Refused {
    public Field() {
      super("f", "field access");
    }
  }

  public static final class Arrays extends Refused {
    public Arrays() {
      super("a", "an array operation");
    }
  }

  public static final class Lists extends Refused {
    public Lists() {
      super("l", "a list operation");
    }
  }

  public static final class JvmView extends Refused {
    public JvmView() {
      super("j", "a JVM view (imports)");
    }
  }

  public static final class Help extends Refused {
    public Help() {
      super("h", "a help page");
    }
  }

  public static final class Dir extends Refused {
    public Dir() {
      super("d", "listing members (dir)");
    }
  }

  public static final class Stream extends Refused {
    public Stream() {
      super("S", "a stream call");
    }
  }

  public static final class Shutdown extends Refused {
    public Shutdown() {
      super("s", "stopping the gateway (use the control plane's shutdown())");
    }
  }
}
