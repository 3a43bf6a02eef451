package io.unstall.flight.format;

import io.unstall.flight.storage.Storage;
import java.io.IOException;
import java.nio.ByteBuffer;
import org.apache.parquet.io.InputFile;
import org.apache.parquet.io.SeekableInputStream;

/** A stored file as parquet-java's {@link InputFile}, read through the dataset's storage. */
final class StorageInputFile implements InputFile {
  private final Storage storage;
  private final String file;
  private final long size;

  StorageInputFile(Storage storage, String file, long size) {
    this.storage = storage;
    this.file = file;
    this.size = size;
  }

  @Override
  public long getLength() {
    return size;
  }

  @Override
  public SeekableInputStream newStream() {
    StorageChannel ch = new StorageChannel(storage, file, size, 256 << 10);
    return new SeekableInputStream() {
      @Override
      public long getPos() {
        return ch.position();
      }

      @Override
      public void seek(long pos) {
        ch.position(pos);
      }

      @Override
      public void readFully(byte[] b) throws IOException {
        ch.readFully(ch.position(), ByteBuffer.wrap(b));
      }

      @Override
      public void readFully(byte[] b, int off, int len) throws IOException {
        ch.readFully(ch.position(), ByteBuffer.wrap(b, off, len));
      }

      @Override
      public int read(ByteBuffer buf) throws IOException {
        return ch.read(buf);
      }

      @Override
      public void readFully(ByteBuffer buf) throws IOException {
        ch.readFully(ch.position(), buf);
      }

      @Override
      public int read() throws IOException {
        ByteBuffer one = ByteBuffer.allocate(1);
        return ch.read(one) < 0 ? -1 : one.get(0) & 0xff;
      }

      @Override
      public int read(byte[] b, int off, int len) throws IOException {
        return len == 0 ? 0 : ch.read(ByteBuffer.wrap(b, off, len));
      }
    };
  }
}
