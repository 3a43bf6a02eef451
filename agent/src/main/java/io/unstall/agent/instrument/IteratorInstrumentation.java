package io.unstall.agent.instrument;

import static net.bytebuddy.matcher.ElementMatchers.hasSuperType;
import static net.bytebuddy.matcher.ElementMatchers.isAbstract;
import static net.bytebuddy.matcher.ElementMatchers.isBridge;
import static net.bytebuddy.matcher.ElementMatchers.isInterface;
import static net.bytebuddy.matcher.ElementMatchers.named;
import static net.bytebuddy.matcher.ElementMatchers.not;

import io.unstall.agent.bootstrap.IoBridge;
import io.unstall.agent.bootstrap.ThreadState;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.WeakHashMap;
import net.bytebuddy.agent.builder.AgentBuilder;
import net.bytebuddy.asm.Advice;
import net.bytebuddy.matcher.ElementMatcher;

/**
 * "Next batch" methods: each outermost call on a thread is one data stall. Types are matched by
 * name or by any supertype name (so every DataSetIterator implementation is covered), but only in
 * class loaders that can see the named type, which keeps class loading cheap elsewhere.
 */
public final class IteratorInstrumentation {
  private IteratorInstrumentation() {}

  /** Parses {@code type#method} specs and groups the method names by type. */
  public static Map<String, List<String>> parse(List<String> specs) {
    Map<String, List<String>> byType = new LinkedHashMap<>();
    for (String spec : specs) {
      int hash = spec.indexOf('#');
      if (hash <= 0 || hash == spec.length() - 1) {
        throw new IllegalArgumentException("expected type#method, got '" + spec + "'");
      }
      byType
          .computeIfAbsent(spec.substring(0, hash).trim(), k -> new java.util.ArrayList<>())
          .add(spec.substring(hash + 1).trim());
    }
    return byType;
  }

  public static AgentBuilder apply(AgentBuilder agent, List<String> specs) {
    AgentBuilder result = agent;
    for (Map.Entry<String, List<String>> e : parse(specs).entrySet()) {
      String typeName = e.getKey();
      ElementMatcher.Junction<net.bytebuddy.description.method.MethodDescription> methods = null;
      for (String m : e.getValue()) {
        methods = methods == null ? named(m) : methods.or(named(m));
      }
      ElementMatcher.Junction<net.bytebuddy.description.method.MethodDescription> target =
          methods.and(not(isAbstract())).and(not(isBridge()));
      result =
          result
              .type(
                  not(isInterface()).and(hasSuperType(named(typeName))),
                  new CanSee(typeName))
              .transform(
                  (builder, type, loader, module, domain) ->
                      builder.visit(Advice.to(NextBatchAdvice.class).on(target)));
    }
    return result;
  }

  /** Wraps the wait for the next batch. */
  public static class NextBatchAdvice {
    @Advice.OnMethodEnter(suppress = Throwable.class)
    public static ThreadState enter() {
      return IoBridge.iteratorEnter();
    }

    @Advice.OnMethodExit(onThrowable = Throwable.class, suppress = Throwable.class)
    public static void exit(
        @Advice.Enter ThreadState state,
        @Advice.This Object self,
        @Advice.Origin("#m") String method,
        @Advice.Thrown Throwable thrown) {
      IoBridge.iteratorExit(state, self, method, thrown);
    }
  }

  /** Class loaders that can load the named type (cached per loader). */
  static final class CanSee implements ElementMatcher<ClassLoader> {
    private final String resource;
    private final Map<ClassLoader, Boolean> cache =
        Collections.synchronizedMap(new WeakHashMap<>());

    CanSee(String typeName) {
      this.resource = typeName.replace('.', '/') + ".class";
    }

    @Override
    public boolean matches(ClassLoader loader) {
      if (loader == null) {
        return false; // the JDK has no batch iterators
      }
      Boolean known = cache.get(loader);
      if (known == null) {
        IoBridge.enterAgent();
        try {
          known = loader.getResource(resource) != null;
        } catch (RuntimeException e) {
          known = false;
        } finally {
          IoBridge.exitAgent();
        }
        cache.put(loader, known);
      }
      return known;
    }
  }
}
