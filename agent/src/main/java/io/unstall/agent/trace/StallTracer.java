package io.unstall.agent.trace;

import static io.unstall.agent.trace.StallAttributes.CHECKPOINT_BYTES;
import static io.unstall.agent.trace.StallAttributes.CHECKPOINT_DURATION_NS;
import static io.unstall.agent.trace.StallAttributes.CHECKPOINT_PATH;
import static io.unstall.agent.trace.StallAttributes.CHECKPOINT_SPAN_NAME;
import static io.unstall.agent.trace.StallAttributes.CHECKPOINT_SYNCS;
import static io.unstall.agent.trace.StallAttributes.CHECKPOINT_TRAINING_THREAD;
import static io.unstall.agent.trace.StallAttributes.CHECKPOINT_WRITE_CALLS;
import static io.unstall.agent.trace.StallAttributes.CHECKPOINT_WRITE_TIME_NS;
import static io.unstall.agent.trace.StallAttributes.EXCEPTION_TYPE;
import static io.unstall.agent.trace.StallAttributes.IO_BYTES;
import static io.unstall.agent.trace.StallAttributes.IO_FILES;
import static io.unstall.agent.trace.StallAttributes.IO_PROCESS_BYTES;
import static io.unstall.agent.trace.StallAttributes.IO_READ_CALLS;
import static io.unstall.agent.trace.StallAttributes.IO_READ_TIME_NS;
import static io.unstall.agent.trace.StallAttributes.ITERATOR_CLASS;
import static io.unstall.agent.trace.StallAttributes.ITERATOR_METHOD;
import static io.unstall.agent.trace.StallAttributes.SPAN_NAME;
import static io.unstall.agent.trace.StallAttributes.STALL_DURATION_NS;
import static io.unstall.agent.trace.StallAttributes.THREAD_ID;
import static io.unstall.agent.trace.StallAttributes.THREAD_NAME;

import io.opentelemetry.api.trace.Span;
import io.opentelemetry.api.trace.SpanBuilder;
import io.opentelemetry.api.trace.SpanKind;
import io.opentelemetry.api.trace.StatusCode;
import io.opentelemetry.api.trace.Tracer;
import io.opentelemetry.context.Context;
import io.unstall.agent.bootstrap.Checkpoint;
import io.unstall.agent.bootstrap.Sink;
import io.unstall.agent.bootstrap.ThreadState;
import java.time.Instant;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Turns each data stall into one {@value StallAttributes#SPAN_NAME} span and each checkpoint into
 * one {@value StallAttributes#CHECKPOINT_SPAN_NAME} span, children of the application's current
 * span when there is one.
 */
public final class StallTracer implements Sink {
  private final Tracer tracer;
  private final AppContext appContext = new AppContext();
  private final long anchorEpochNanos;
  private final long anchorNanoTime;
  private final long failAtStall;
  private final AtomicLong stalls = new AtomicLong();

  public StallTracer(Tracer tracer, long failAtStall) {
    this.tracer = tracer;
    this.failAtStall = failAtStall;
    Instant now = Instant.now();
    this.anchorNanoTime = System.nanoTime();
    this.anchorEpochNanos = now.getEpochSecond() * 1_000_000_000L + now.getNano();
  }

  @Override
  public void stall(
      Object iterator,
      String method,
      long startNanos,
      long durationNanos,
      ThreadState window,
      long processBytes,
      Throwable error) {
    if (stalls.incrementAndGet() == failAtStall) {
      throw new IllegalStateException("test failure requested by test.fail_at_stall");
    }
    long start = anchorEpochNanos + (startNanos - anchorNanoTime);
    Thread thread = Thread.currentThread();
    SpanBuilder b =
        tracer
            .spanBuilder(SPAN_NAME)
            .setSpanKind(SpanKind.INTERNAL)
            .setStartTimestamp(start, TimeUnit.NANOSECONDS)
            .setAttribute(ITERATOR_CLASS, iterator.getClass().getName())
            .setAttribute(ITERATOR_METHOD, method)
            .setAttribute(STALL_DURATION_NS, durationNanos)
            .setAttribute(IO_BYTES, window.bytes())
            .setAttribute(IO_READ_CALLS, window.readCalls())
            .setAttribute(IO_FILES, (long) window.files())
            .setAttribute(IO_READ_TIME_NS, window.readNanos())
            .setAttribute(IO_PROCESS_BYTES, processBytes)
            .setAttribute(THREAD_NAME, thread.getName())
            .setAttribute(THREAD_ID, thread.getId());
    setParent(b, appContext.parentFor(iterator));
    Span span = b.startSpan();
    if (error != null) {
      span.setStatus(StatusCode.ERROR, error.getClass().getName());
      span.setAttribute(EXCEPTION_TYPE, error.getClass().getName());
    }
    span.end(start + durationNanos, TimeUnit.NANOSECONDS);
  }

  @Override
  public Object currentContext() {
    return appContext.parentFor(null);
  }

  @Override
  public void checkpoint(Checkpoint c) {
    long start = anchorEpochNanos + (c.startNanos - anchorNanoTime);
    SpanBuilder b =
        tracer
            .spanBuilder(CHECKPOINT_SPAN_NAME)
            .setSpanKind(SpanKind.INTERNAL)
            .setStartTimestamp(start, TimeUnit.NANOSECONDS)
            .setAttribute(CHECKPOINT_PATH, c.path)
            .setAttribute(CHECKPOINT_BYTES, c.bytes)
            .setAttribute(CHECKPOINT_WRITE_CALLS, c.writes)
            .setAttribute(CHECKPOINT_WRITE_TIME_NS, c.writeNanos)
            .setAttribute(CHECKPOINT_SYNCS, c.syncs)
            .setAttribute(CHECKPOINT_DURATION_NS, c.durationNanos)
            .setAttribute(CHECKPOINT_TRAINING_THREAD, c.trainingThread);
    if (c.threadName != null) {
      b.setAttribute(THREAD_NAME, c.threadName).setAttribute(THREAD_ID, c.threadId);
    }
    setParent(b, c.parent instanceof Context ? (Context) c.parent : null);
    b.startSpan().end(start + c.durationNanos, TimeUnit.NANOSECONDS);
  }

  private static void setParent(SpanBuilder b, Context parent) {
    if (parent != null) {
      b.setParent(parent);
    } else {
      b.setNoParent();
    }
  }
}
