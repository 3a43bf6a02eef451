package io.unstall.flight.storage;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.List;

/** A storage whose sample reads pass through a shared {@link Throttle}. */
public final class ThrottledStorage implements Storage {
  private final Storage inner;
  private final Throttle throttle;

  public ThrottledStorage(Storage inner, Throttle throttle) {
    this.inner = inner;
    this.throttle = throttle;
  }

  @Override
  public String uri() {
    return inner.uri();
  }

  @Override
  public boolean isSingleObject() {
    return inner.isSingleObject();
  }

  @Override
  public List<String> listDirectories(String dir) throws IOException {
    return inner.listDirectories(dir);
  }

  @Override
  public List<String> listObjects(String dir) throws IOException {
    return inner.listObjects(dir);
  }

  @Override
  public long size(String path) throws IOException {
    return inner.size(path);
  }

  @Override
  public long pin(String path) throws IOException {
    return inner.pin(path);
  }

  @Override
  public void readFully(String path, long offset, ByteBuffer dst) throws IOException {
    throttle.acquire(dst.remaining());
    inner.readFully(path, offset, dst);
  }

  @Override
  public String version(String path) throws IOException {
    return inner.version(path);
  }

  @Override
  public String describe(String path) {
    return inner.describe(path);
  }

  @Override
  public void close() throws IOException {
    inner.close();
  }
}
