package io.unstall.agent.bootstrap;

/** Receives the end of each data stall and each checkpoint; implemented by the agent. */
public interface Sink {

  /**
   * Called on the thread that waited, after the outermost "next batch" method returned or threw.
   *
   * @param iterator the object whose next-batch method was called
   * @param method the method name, for example {@code next}
   * @param startNanos {@link System#nanoTime()} when the wait began
   * @param durationNanos how long the wait took
   * @param window the I/O this thread did during the wait (valid only during the call)
   * @param processBytes bytes read by all threads of the process during the wait
   * @param error what the method threw, or null
   */
  void stall(
      Object iterator,
      String method,
      long startNanos,
      long durationNanos,
      ThreadState window,
      long processBytes,
      Throwable error);

  /**
   * Called on the writing thread when its burst of writes to a file becomes large enough to be a
   * checkpoint: the application's current context, the parent of the checkpoint span.
   */
  default Object currentContext() {
    return null;
  }

  /** Called once per checkpoint, usually on the thread that wrote it (at exit, on the hook's). */
  default void checkpoint(Checkpoint c) {}
}
