package io.unstall.agent.trace;

import static io.opentelemetry.api.common.AttributeKey.booleanKey;
import static io.opentelemetry.api.common.AttributeKey.longKey;
import static io.opentelemetry.api.common.AttributeKey.stringKey;

import io.opentelemetry.api.common.AttributeKey;

/**
 * The stable names of the stall and checkpoint spans and their attributes. The Python shim emits the same names;
 * change them only together with docs/AGENT.md.
 */
public final class StallAttributes {
  private StallAttributes() {}

  /** One span per wait for the next batch. */
  public static final String SPAN_NAME = "unstall.stall";

  /** One span per checkpoint: a burst of writes to one file between training steps. */
  public static final String CHECKPOINT_SPAN_NAME = "unstall.checkpoint";

  /** The instrumentation scope (tracer) name. */
  public static final String SCOPE = "io.unstall.agent";

  public static final AttributeKey<Long> STALL_DURATION_NS = longKey("unstall.stall.duration_ns");
  public static final AttributeKey<Long> IO_BYTES = longKey("unstall.io.bytes");
  public static final AttributeKey<Long> IO_READ_CALLS = longKey("unstall.io.read_calls");
  public static final AttributeKey<Long> IO_FILES = longKey("unstall.io.files");
  public static final AttributeKey<Long> IO_READ_TIME_NS = longKey("unstall.io.read_time_ns");
  public static final AttributeKey<Long> IO_PROCESS_BYTES = longKey("unstall.io.process_bytes");
  public static final AttributeKey<String> ITERATOR_CLASS = stringKey("unstall.iterator.class");
  public static final AttributeKey<String> ITERATOR_METHOD = stringKey("unstall.iterator.method");
  public static final AttributeKey<String> THREAD_NAME = stringKey("thread.name");
  public static final AttributeKey<Long> THREAD_ID = longKey("thread.id");
  public static final AttributeKey<String> CHECKPOINT_PATH = stringKey("unstall.checkpoint.path");
  public static final AttributeKey<Long> CHECKPOINT_BYTES = longKey("unstall.checkpoint.bytes");
  public static final AttributeKey<Long> CHECKPOINT_WRITE_CALLS =
      longKey("unstall.checkpoint.write_calls");
  public static final AttributeKey<Long> CHECKPOINT_WRITE_TIME_NS =
      longKey("unstall.checkpoint.write_time_ns");
  public static final AttributeKey<Long> CHECKPOINT_SYNCS = longKey("unstall.checkpoint.syncs");
  public static final AttributeKey<Long> CHECKPOINT_DURATION_NS =
      longKey("unstall.checkpoint.duration_ns");
  public static final AttributeKey<Boolean> CHECKPOINT_TRAINING_THREAD =
      booleanKey("unstall.checkpoint.training_thread");
  public static final AttributeKey<String> EXCEPTION_TYPE = stringKey("exception.type");
}
