package io.unstall.agent.instrument;

import static net.bytebuddy.matcher.ElementMatchers.isBridge;
import static net.bytebuddy.matcher.ElementMatchers.isPublic;
import static net.bytebuddy.matcher.ElementMatchers.named;
import static net.bytebuddy.matcher.ElementMatchers.not;
import static net.bytebuddy.matcher.ElementMatchers.takesArguments;

import io.unstall.agent.bootstrap.IoBridge;
import io.unstall.agent.bootstrap.ThreadState;
import java.nio.ByteBuffer;
import net.bytebuddy.agent.builder.AgentBuilder;
import net.bytebuddy.asm.Advice;
import net.bytebuddy.asm.AsmVisitorWrapper;

/**
 * The JDK file readers and writers. Only leaf methods that end in a native read are matched, so a compound
 * call (readFully, readAllBytes, Files.readAllBytes, a BufferedInputStream refill) is counted
 * once per system call it makes. The java.nio.file.Files helpers (readAllBytes, readString,
 * lines, newInputStream, newByteChannel) all read through sun.nio.ch.FileChannelImpl. Writes
 * are matched the same way: FileOutputStream and RandomAccessFile write(...), FileChannelImpl
 * write(...) (which Files.write and Files.newOutputStream use) and force(boolean) (fsync).
 */
public final class FileIoInstrumentation {
  private FileIoInstrumentation() {}

  public static final String FILE_INPUT_STREAM = "java.io.FileInputStream";
  public static final String RANDOM_ACCESS_FILE = "java.io.RandomAccessFile";
  public static final String FILE_CHANNEL_IMPL = "sun.nio.ch.FileChannelImpl";
  public static final String FILE_OUTPUT_STREAM = "java.io.FileOutputStream";

  /** write(byte[]), write(byte[], int, int) and write(int) of FileOutputStream and RandomAccessFile. */
  private static final AsmVisitorWrapper STREAM_WRITES =
      new AsmVisitorWrapper.Compound(
          Advice.to(ArrayWriteAdvice.class)
              .on(named("write").and(isPublic()).and(takesArguments(byte[].class))),
          Advice.to(RangeWriteAdvice.class)
              .on(
                  named("write")
                      .and(isPublic())
                      .and(takesArguments(byte[].class, int.class, int.class))),
          Advice.to(ByteWriteAdvice.class)
              .on(named("write").and(isPublic()).and(takesArguments(int.class))));

  public static AgentBuilder apply(AgentBuilder agent) {
    return agent
        .type(named(FILE_INPUT_STREAM).or(named(RANDOM_ACCESS_FILE)))
        .transform(
            (builder, type, loader, module, domain) ->
                builder
                    .visit(
                        Advice.to(ArrayReadAdvice.class)
                            .on(
                                named("read")
                                    .and(isPublic())
                                    .and(
                                        takesArguments(byte[].class)
                                            .or(takesArguments(byte[].class, int.class, int.class)))))
                    .visit(
                        Advice.to(ByteReadAdvice.class)
                            .on(named("read").and(isPublic()).and(takesArguments(0))))
                    .visit(
                        Advice.to(SeekAdvice.class)
                            .on(named("seek").and(takesArguments(long.class))))
                    .visit(
                        Advice.to(SkipAdvice.class)
                            .on(named("skip").and(isPublic()).and(takesArguments(long.class))))
                    .visit(STREAM_WRITES))
        .type(named(FILE_OUTPUT_STREAM))
        .transform(
            (builder, type, loader, module, domain) ->
                builder.visit(STREAM_WRITES))
        .type(named(FILE_CHANNEL_IMPL))
        .transform(
            (builder, type, loader, module, domain) ->
                builder
                    .visit(
                        Advice.to(ChannelReadAdvice.class)
                            .on(named("read").and(takesArguments(ByteBuffer.class))))
                    .visit(
                        Advice.to(ChannelScatterReadAdvice.class)
                            .on(
                                named("read")
                                    .and(takesArguments(ByteBuffer[].class, int.class, int.class))))
                    .visit(
                        Advice.to(ChannelPositionalReadAdvice.class)
                            .on(named("read").and(takesArguments(ByteBuffer.class, long.class))))
                    .visit(
                        Advice.to(ChannelWriteAdvice.class)
                            .on(named("write").and(takesArguments(ByteBuffer.class))))
                    .visit(
                        Advice.to(ChannelGatherWriteAdvice.class)
                            .on(
                                named("write")
                                    .and(takesArguments(ByteBuffer[].class, int.class, int.class))))
                    .visit(
                        Advice.to(ChannelPositionalWriteAdvice.class)
                            .on(named("write").and(takesArguments(ByteBuffer.class, long.class))))
                    .visit(
                        Advice.to(ForceAdvice.class)
                            .on(named("force").and(takesArguments(boolean.class))))
                    .visit(
                        Advice.to(SeekAdvice.class)
                            .on(
                                named("position")
                                    .and(takesArguments(long.class))
                                    .and(not(isBridge())))));
  }

  /** read(byte[]) and read(byte[], int, int) of FileInputStream and RandomAccessFile. */
  public static class ArrayReadAdvice {
    @Advice.OnMethodEnter(suppress = Throwable.class)
    public static ThreadState enter() {
      return IoBridge.readEnter();
    }

    @Advice.OnMethodExit(onThrowable = Throwable.class, suppress = Throwable.class)
    public static void exit(
        @Advice.Enter ThreadState state,
        @Advice.This Object self,
        @Advice.FieldValue("path") String path,
        @Advice.Return int n) {
      IoBridge.readExit(state, self, path, n, -1L);
    }
  }

  /** read() returns the byte, not a count. */
  public static class ByteReadAdvice {
    @Advice.OnMethodEnter(suppress = Throwable.class)
    public static ThreadState enter() {
      return IoBridge.readEnter();
    }

    @Advice.OnMethodExit(onThrowable = Throwable.class, suppress = Throwable.class)
    public static void exit(
        @Advice.Enter ThreadState state,
        @Advice.This Object self,
        @Advice.FieldValue("path") String path,
        @Advice.Return int value,
        @Advice.Thrown Throwable thrown) {
      IoBridge.readExit(state, self, path, thrown != null ? 0 : (value < 0 ? -1 : 1), -1L);
    }
  }

  /** RandomAccessFile.seek(long) and FileChannel.position(long). */
  public static class SeekAdvice {
    @Advice.OnMethodExit(suppress = Throwable.class)
    public static void exit(
        @Advice.This Object self,
        @Advice.FieldValue("path") String path,
        @Advice.Argument(0) long position) {
      IoBridge.seekExit(self, path, position);
    }
  }

  /** FileInputStream.skip(long). */
  public static class SkipAdvice {
    @Advice.OnMethodExit(suppress = Throwable.class)
    public static void exit(
        @Advice.This Object self,
        @Advice.FieldValue("path") String path,
        @Advice.Return long skipped) {
      IoBridge.skipExit(self, path, skipped);
    }
  }

  /** FileChannel.read(ByteBuffer), at the channel position. */
  public static class ChannelReadAdvice {
    @Advice.OnMethodEnter(suppress = Throwable.class)
    public static ThreadState enter() {
      return IoBridge.readEnter();
    }

    @Advice.OnMethodExit(onThrowable = Throwable.class, suppress = Throwable.class)
    public static void exit(
        @Advice.Enter ThreadState state,
        @Advice.This Object self,
        @Advice.FieldValue("path") String path,
        @Advice.Return int n) {
      IoBridge.readExit(state, self, path, n, -1L);
    }
  }

  /** FileChannel.read(ByteBuffer[], int, int), at the channel position. */
  public static class ChannelScatterReadAdvice {
    @Advice.OnMethodEnter(suppress = Throwable.class)
    public static ThreadState enter() {
      return IoBridge.readEnter();
    }

    @Advice.OnMethodExit(onThrowable = Throwable.class, suppress = Throwable.class)
    public static void exit(
        @Advice.Enter ThreadState state,
        @Advice.This Object self,
        @Advice.FieldValue("path") String path,
        @Advice.Return long n) {
      IoBridge.readExit(state, self, path, n, -1L);
    }
  }

  /** FileChannel.read(ByteBuffer, long): positional, leaves the channel position alone. */
  public static class ChannelPositionalReadAdvice {
    @Advice.OnMethodEnter(suppress = Throwable.class)
    public static ThreadState enter() {
      return IoBridge.readEnter();
    }

    @Advice.OnMethodExit(onThrowable = Throwable.class, suppress = Throwable.class)
    public static void exit(
        @Advice.Enter ThreadState state,
        @Advice.This Object self,
        @Advice.FieldValue("path") String path,
        @Advice.Argument(1) long position,
        @Advice.Return int n) {
      IoBridge.readExit(state, self, path, n, position);
    }
  }

  /** write(byte[]) of FileOutputStream and RandomAccessFile: the whole array, or nothing if it threw. */
  public static class ArrayWriteAdvice {
    @Advice.OnMethodEnter(suppress = Throwable.class)
    public static ThreadState enter() {
      return IoBridge.writeEnter();
    }

    @Advice.OnMethodExit(onThrowable = Throwable.class, suppress = Throwable.class)
    public static void exit(
        @Advice.Enter ThreadState state,
        @Advice.This Object self,
        @Advice.FieldValue("path") String path,
        @Advice.Argument(0) byte[] b,
        @Advice.Thrown Throwable thrown) {
      IoBridge.writeExit(state, self, path, thrown != null || b == null ? 0 : b.length, -1L);
    }
  }

  /** write(byte[], int, int) of FileOutputStream and RandomAccessFile. */
  public static class RangeWriteAdvice {
    @Advice.OnMethodEnter(suppress = Throwable.class)
    public static ThreadState enter() {
      return IoBridge.writeEnter();
    }

    @Advice.OnMethodExit(onThrowable = Throwable.class, suppress = Throwable.class)
    public static void exit(
        @Advice.Enter ThreadState state,
        @Advice.This Object self,
        @Advice.FieldValue("path") String path,
        @Advice.Argument(2) int len,
        @Advice.Thrown Throwable thrown) {
      IoBridge.writeExit(state, self, path, thrown != null ? 0 : len, -1L);
    }
  }

  /** write(int): one byte. */
  public static class ByteWriteAdvice {
    @Advice.OnMethodEnter(suppress = Throwable.class)
    public static ThreadState enter() {
      return IoBridge.writeEnter();
    }

    @Advice.OnMethodExit(onThrowable = Throwable.class, suppress = Throwable.class)
    public static void exit(
        @Advice.Enter ThreadState state,
        @Advice.This Object self,
        @Advice.FieldValue("path") String path,
        @Advice.Thrown Throwable thrown) {
      IoBridge.writeExit(state, self, path, thrown != null ? 0 : 1, -1L);
    }
  }

  /** FileChannel.write(ByteBuffer), at the channel position. */
  public static class ChannelWriteAdvice {
    @Advice.OnMethodEnter(suppress = Throwable.class)
    public static ThreadState enter() {
      return IoBridge.writeEnter();
    }

    @Advice.OnMethodExit(onThrowable = Throwable.class, suppress = Throwable.class)
    public static void exit(
        @Advice.Enter ThreadState state,
        @Advice.This Object self,
        @Advice.FieldValue("path") String path,
        @Advice.Return int n) {
      IoBridge.writeExit(state, self, path, n, -1L);
    }
  }

  /** FileChannel.write(ByteBuffer[], int, int), at the channel position. */
  public static class ChannelGatherWriteAdvice {
    @Advice.OnMethodEnter(suppress = Throwable.class)
    public static ThreadState enter() {
      return IoBridge.writeEnter();
    }

    @Advice.OnMethodExit(onThrowable = Throwable.class, suppress = Throwable.class)
    public static void exit(
        @Advice.Enter ThreadState state,
        @Advice.This Object self,
        @Advice.FieldValue("path") String path,
        @Advice.Return long n) {
      IoBridge.writeExit(state, self, path, n, -1L);
    }
  }

  /** FileChannel.write(ByteBuffer, long): positional, leaves the channel position alone. */
  public static class ChannelPositionalWriteAdvice {
    @Advice.OnMethodEnter(suppress = Throwable.class)
    public static ThreadState enter() {
      return IoBridge.writeEnter();
    }

    @Advice.OnMethodExit(onThrowable = Throwable.class, suppress = Throwable.class)
    public static void exit(
        @Advice.Enter ThreadState state,
        @Advice.This Object self,
        @Advice.FieldValue("path") String path,
        @Advice.Argument(1) long position,
        @Advice.Return int n) {
      IoBridge.writeExit(state, self, path, n, position);
    }
  }

  /** FileChannel.force(boolean): fsync/fdatasync of the channel's file. */
  public static class ForceAdvice {
    @Advice.OnMethodEnter(suppress = Throwable.class)
    public static ThreadState enter() {
      return IoBridge.writeEnter();
    }

    @Advice.OnMethodExit(onThrowable = Throwable.class, suppress = Throwable.class)
    public static void exit(
        @Advice.Enter ThreadState state,
        @Advice.This Object self,
        @Advice.FieldValue("path") String path) {
      IoBridge.syncExit(state, self, path);
    }
  }
}
