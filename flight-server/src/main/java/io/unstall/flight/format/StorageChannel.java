package io.unstall.flight.format;

import io.unstall.flight.storage.Storage;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.NonWritableChannelException;
import java.nio.channels.SeekableByteChannel;

/**
 * One object of a {@link Storage} as a read-only channel for indexing: reads are served from a read-ahead block of
 * {@code block} bytes, refilled by one ranged request at the position asked for, so walking a file's headers costs
 * one request per block (not per header) and a large member is skipped, not read. Not thread-safe.
 */
final class StorageChannel implements SeekableByteChannel {
  private final Storage storage;
  private final String path;
  private final long size;
  private final ByteBuffer block;
  private long blockStart = -1;
  private long position;

  StorageChannel(Storage storage, String path, long size, int block) {
    this.storage = storage;
    this.path = path;
    this.size = size;
    this.block = ByteBuffer.allocate((int) Math.min(block, Math.max(size, 1)));
  }

  /** Reads exactly {@code dst.remaining()} bytes at {@code at} (callers check the size first). */
  void readFully(long at, ByteBuffer dst) throws IOException {
    position = at;
    while (dst.hasRemaining()) {
      if (read(dst) < 0) {
        throw new java.io.EOFException(storage.describe(path) + ": unexpected end at byte offset " + position);
      }
    }
  }

  @Override
  public int read(ByteBuffer dst) throws IOException {
    if (position >= size) {
      return -1;
    }
    int want = (int) Math.min(dst.remaining(), size - position);
    if (want >= block.capacity()) { // a large read goes straight through
      ByteBuffer slice = dst.slice().limit(want);
      storage.readFully(path, position, slice);
      dst.position(dst.position() + want);
      position += want;
      return want;
    }
    if (blockStart < 0 || position < blockStart || position >= blockStart + block.limit()) {
      block.clear().limit((int) Math.min(block.capacity(), size - position));
      storage.readFully(path, position, block);
      block.flip();
      blockStart = position;
    }
    int from = (int) (position - blockStart);
    int n = Math.min(want, block.limit() - from);
    dst.put(block.duplicate().position(from).limit(from + n));
    position += n;
    return n;
  }

  @Override
  public long position() {
    return position;
  }

  @Override
  public SeekableByteChannel position(long newPosition) {
    if (newPosition < 0) {
      throw new IllegalArgumentException("negative position " + newPosition);
    }
    position = newPosition;
    return this;
  }

  @Override
  public long size() {
    return size;
  }

  @Override
  public int write(ByteBuffer src) {
    throw new NonWritableChannelException();
  }

  @Override
  public SeekableByteChannel truncate(long s) {
    throw new NonWritableChannelException();
  }

  @Override
  public boolean isOpen() {
    return true;
  }

  @Override
  public void close() {}
}
