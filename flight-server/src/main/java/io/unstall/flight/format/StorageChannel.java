package io.unstall.flight.format;

import io.unstall.flight.storage.Storage;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.NonWritableChannelException;
import java.nio.channels.SeekableByteChannel;

/**
 * One stored file as a read-only {@link SeekableByteChannel} (for readers that take a channel: jHDF, Parquet's
 * footer), through the dataset's {@link Storage}: local or S3 alike, with its pins. Small reads are served
 * from one aligned block fetched whole, so a reader walking metadata in small steps makes few ranged requests.
 */
final class StorageChannel implements SeekableByteChannel {
  private static final int BLOCK = 256 << 10;
  private final Storage storage;
  private final String file;
  private final long size;
  private long position;
  private long blockStart = -1;
  private ByteBuffer block;

  StorageChannel(Storage storage, String file, long size) {
    this.storage = storage;
    this.file = file;
    this.size = size;
  }

  @Override
  public int read(ByteBuffer dst) throws IOException {
    if (position >= size) {
      return -1;
    }
    int n = (int) Math.min(dst.remaining(), size - position);
    if (n >= BLOCK) { // large reads go straight to storage
      storage.readFully(file, position, dst.slice().limit(n));
      dst.position(dst.position() + n);
    } else {
      long start = position / BLOCK * BLOCK;
      if (start != blockStart) {
        block = ByteBuffer.allocate((int) Math.min(BLOCK, size - start));
        storage.readFully(file, start, block);
        blockStart = start;
      }
      n = Math.min(n, block.capacity() - (int) (position - start));
      dst.put(block.duplicate().position((int) (position - start)).limit((int) (position - start) + n));
    }
    position += n;
    return n;
  }

  /** Reads exactly {@code dst.remaining()} bytes at the position, or fails naming the file and offset. */
  void readFully(ByteBuffer dst) throws IOException {
    long at = position;
    while (dst.hasRemaining()) {
      if (read(dst) < 0) {
        throw new java.io.EOFException(
            "'" + storage.describe(file) + "' ends at byte " + size + ", before the " + dst.remaining()
                + " bytes wanted at byte offset " + at);
      }
    }
  }

  @Override
  public long position() {
    return position;
  }

  @Override
  public SeekableByteChannel position(long newPosition) {
    this.position = newPosition;
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
  public void close() {
    block = null;
  }
}
