package io.unstall.agent.trace;

import io.opentelemetry.api.trace.Span;
import io.opentelemetry.api.trace.SpanContext;
import io.opentelemetry.api.trace.TraceFlags;
import io.opentelemetry.api.trace.TraceState;
import io.opentelemetry.context.Context;
import java.lang.reflect.Method;
import java.util.Collections;
import java.util.Map;
import java.util.WeakHashMap;

/**
 * Reads the application's current span, by reflection, so a stall span can become a child of the
 * training step. The agent's OpenTelemetry is relocated and cannot see the application's context
 * otherwise. Tried in order: the application's own (unshaded) OpenTelemetry API in the class
 * loader of the iterator, then in the thread's context class loader, then the official
 * OpenTelemetry Java agent's API, which that agent shades and puts on the bootstrap class path
 * (it bridges the application's API to the same context, and it also sees the spans of its own
 * instrumentation when the application has no API on its class path).
 */
final class AppContext {
  // Built at run time so that shading does not relocate the application's API names.
  private static final String API = String.join(".", "io", "opentelemetry.api.trace.");
  /** The official OpenTelemetry Java agent's shaded copy of the API, on the bootstrap path. */
  private static final String JAVAAGENT_API =
      String.join(".", "io", "opentelemetry.javaagent.shaded.io", "opentelemetry.api.trace.");

  private static final Reader NONE = new Reader(null, null, null, null, null, null);
  private final Map<ClassLoader, Reader> readers = Collections.synchronizedMap(new WeakHashMap<>());

  private volatile Reader javaagent;

  /**
   * The application's current span as a parent for the agent's SDK, or null when there is none.
   *
   * @param iterator the object whose class loader is asked first, or null
   */
  Context parentFor(Object iterator) {
    Context c = null;
    if (iterator != null) {
      c = readerFor(iterator.getClass().getClassLoader()).current();
    }
    if (c == null) {
      c = readerFor(Thread.currentThread().getContextClassLoader()).current();
    }
    if (c == null) {
      Reader r = javaagent;
      if (r == null) {
        r = Reader.create(JAVAAGENT_API, null);
        javaagent = r;
      }
      c = r.current();
    }
    return c;
  }

  private Reader readerFor(ClassLoader loader) {
    if (loader == null) {
      return NONE;
    }
    Reader r = readers.get(loader);
    if (r == null) {
      r = Reader.create(API, loader);
      readers.put(loader, r);
    }
    return r;
  }

  private static final class Reader {
    final Method current;
    final Method getSpanContext;
    final Method isValid;
    final Method traceId;
    final Method spanId;
    final Method sampled;

    Reader(Method current, Method getSpanContext, Method isValid, Method traceId, Method spanId,
        Method sampled) {
      this.current = current;
      this.getSpanContext = getSpanContext;
      this.isValid = isValid;
      this.traceId = traceId;
      this.spanId = spanId;
      this.sampled = sampled;
    }

    /** Reflection into {@code pkg.Span} and {@code pkg.SpanContext} of {@code loader} (null: bootstrap). */
    static Reader create(String pkg, ClassLoader loader) {
      try {
        Class<?> span = Class.forName(pkg + "Span", false, loader);
        Class<?> ctx = Class.forName(pkg + "SpanContext", false, loader);
        return new Reader(
            span.getMethod("current"),
            span.getMethod("getSpanContext"),
            ctx.getMethod("isValid"),
            ctx.getMethod("getTraceId"),
            ctx.getMethod("getSpanId"),
            ctx.getMethod("isSampled"));
      } catch (ReflectiveOperationException | LinkageError e) {
        return NONE;
      }
    }

    Context current() {
      if (current == null) {
        return null;
      }
      try {
        Object sc = getSpanContext.invoke(current.invoke(null));
        if (!(Boolean) isValid.invoke(sc)) {
          return null;
        }
        SpanContext parent =
            SpanContext.create(
                (String) traceId.invoke(sc),
                (String) spanId.invoke(sc),
                (Boolean) sampled.invoke(sc) ? TraceFlags.getSampled() : TraceFlags.getDefault(),
                TraceState.getDefault());
        return Context.root().with(Span.wrap(parent));
      } catch (ReflectiveOperationException | RuntimeException e) {
        return null;
      }
    }
  }
}
