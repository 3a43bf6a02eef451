package io.unstall.flight.format;

import java.util.Arrays;
import java.util.List;

/**
 * The stable sample ids of a dataset: id {@code i} is row {@code i} here. Columnar (arrays, not objects) so
 * that an index of millions of samples costs a few tens of bytes per sample.
 */
public final class SampleIndex {
  private final List<String> files;
  private final int[] file;
  private final long[] offset;
  private final int[] length;
  private final long[] label;
  private final boolean labelled;
  private final long totalBytes;
  private final String layout;

  private SampleIndex(
      List<String> files, int[] file, long[] offset, int[] length, long[] label, boolean labelled, String layout) {
    this.files = List.copyOf(files);
    this.file = file;
    this.offset = offset;
    this.length = length;
    this.label = label;
    this.labelled = labelled;
    this.layout = layout;
    long t = 0;
    for (int len : length) {
      t += len;
    }
    this.totalBytes = t;
  }

  public int size() {
    return file.length;
  }

  public long totalBytes() {
    return totalBytes;
  }

  /** The storage path of sample {@code id}'s file. */
  public String file(int id) {
    return files.get(file[id]);
  }

  public long offset(int id) {
    return offset[id];
  }

  public int length(int id) {
    return length[id];
  }

  public boolean labelled() {
    return labelled;
  }

  public long label(int id) {
    return label[id];
  }

  public List<String> files() {
    return files;
  }

  /**
   * What a client needs to decode this dataset's samples (a JSON object: an array's dtype and row shape, a CSV's
   * columns and types, ...), or "" when its samples are plain files or records. Sent in the dataset description.
   */
  public String layout() {
    return layout;
  }

  /** Accumulates samples in id order. */
  public static final class Builder {
    private final List<String> files = new java.util.ArrayList<>();
    private final boolean labelled;
    private int[] file = new int[1024];
    private long[] offset = new long[1024];
    private int[] length = new int[1024];
    private long[] label = new long[1024];
    private int n;
    private String layout = "";

    public Builder(boolean labelled) {
      this.labelled = labelled;
    }

    /** Sets {@link SampleIndex#layout()}. */
    public Builder layout(String json) {
      this.layout = json;
      return this;
    }

    /** Registers a file and returns its number, to pass to {@link #add}. */
    public int file(String path) {
      files.add(path);
      return files.size() - 1;
    }

    public Builder add(int fileNo, long off, long len, long lab) {
      if (len > Integer.MAX_VALUE - 8) {
        throw new IllegalArgumentException(
            "sample at " + files.get(fileNo) + "@" + off + " is " + len + " bytes; samples must be < 2 GiB");
      }
      if (n == file.length) {
        int cap = n * 2;
        file = Arrays.copyOf(file, cap);
        offset = Arrays.copyOf(offset, cap);
        length = Arrays.copyOf(length, cap);
        label = Arrays.copyOf(label, cap);
      }
      file[n] = fileNo;
      offset[n] = off;
      length[n] = (int) len;
      label[n] = lab;
      n++;
      return this;
    }

    public int size() {
      return n;
    }

    public SampleIndex build() {
      return new SampleIndex(
          files,
          Arrays.copyOf(file, n),
          Arrays.copyOf(offset, n),
          Arrays.copyOf(length, n),
          Arrays.copyOf(label, n),
          labelled,
          layout);
    }
  }
}
