package io.unstall.flight.storage;

import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Stream;

/** The local file system. Files are opened per read: the OS keeps no descriptors for millions of samples. */
public final class LocalStorage implements Storage {
  private final Path root;
  /** Set when the location is one file: the root is then its directory and this its only object. */
  private final String only;

  public LocalStorage(Path location) throws IOException {
    Path abs = location.toAbsolutePath().normalize();
    if (!Files.exists(abs)) {
      throw new NoSuchFileException(abs.toString(), null, "dataset location does not exist");
    }
    boolean file = Files.isRegularFile(abs);
    this.root = file ? abs.getParent() : abs;
    this.only = file ? abs.getFileName().toString() : null;
  }

  @Override
  public String uri() {
    return (only == null ? root : root.resolve(only)).toUri().toString();
  }

  @Override
  public boolean isSingleObject() {
    return only != null;
  }

  @Override
  public List<String> listDirectories(String dir) throws IOException {
    List<String> out = new ArrayList<>();
    try (Stream<Path> s = Files.list(resolve(dir))) {
      s.filter(Files::isDirectory).forEach(p -> out.add(relative(p)));
    }
    out.sort(null);
    return out;
  }

  @Override
  public List<String> listObjects(String dir) throws IOException {
    if (only != null) {
      return List.of(only);
    }
    Path base = resolve(dir);
    List<String> out = new ArrayList<>();
    try (Stream<Path> s = Files.walk(base, java.nio.file.FileVisitOption.FOLLOW_LINKS)) {
      s.filter(Files::isRegularFile).forEach(p -> out.add(relative(p)));
    }
    out.sort(null);
    return out;
  }

  @Override
  public long size(String path) throws IOException {
    return Files.size(resolve(path));
  }

  @Override
  public void readFully(String path, long offset, ByteBuffer dst) throws IOException {
    Path p = resolve(path);
    try (FileChannel ch = FileChannel.open(p, StandardOpenOption.READ)) {
      long pos = offset;
      while (dst.hasRemaining()) {
        int n = ch.read(dst, pos);
        if (n < 0) {
          throw new EOFException(
              "file '" + p + "' ended at byte " + pos + " but the index expects " + dst.remaining()
                  + " more bytes (truncated or changed after registration)");
        }
        pos += n;
      }
    } catch (NoSuchFileException e) {
      throw new NoSuchFileException(p.toString(), null, "file no longer exists (deleted after registration?)");
    }
  }

  @Override
  public String version(String path) throws IOException {
    return Files.getLastModifiedTime(resolve(path)).toMillis() + ":" + Files.size(resolve(path));
  }

  @Override
  public String describe(String path) {
    return resolve(path).toString();
  }

  private Path resolve(String rel) {
    if (rel.isEmpty()) {
      return root;
    }
    Path p = root.resolve(rel).normalize();
    if (!p.startsWith(root)) {
      throw new IllegalArgumentException("path '" + rel + "' escapes the dataset root " + root);
    }
    return p;
  }

  private String relative(Path p) {
    return root.relativize(p).toString().replace(java.io.File.separatorChar, '/');
  }
}
