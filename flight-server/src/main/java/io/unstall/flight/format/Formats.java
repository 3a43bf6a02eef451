package io.unstall.flight.format;

import java.util.Map;
import java.util.TreeMap;
import java.util.function.Function;

/** The formats a dataset can be registered with, by name, each made for a dataset from its options. */
public final class Formats {
  private static final Map<String, Function<FormatOptions, Format>> BY_NAME = new TreeMap<>();

  static {
    BY_NAME.put("imagefolder", o -> {
      o.allow();
      return new ImageFolderFormat();
    });
    BY_NAME.put("tfrecord", o -> {
      o.allow();
      return new TfRecordFormat();
    });
    BY_NAME.put("webdataset", WebDatasetFormat::new);
    BY_NAME.put("npy", NpyFormat::npy);
    BY_NAME.put("npz", NpyFormat::npz);
    BY_NAME.put("csv", CsvFormat::new);
    BY_NAME.put("parquet", ParquetFormat::new);
    BY_NAME.put("hdf5", Hdf5Format::new);
  }

  private Formats() {}

  /** The format {@code name} without options. */
  public static Format byName(String name) {
    return create(name, FormatOptions.NONE);
  }

  /** The format {@code name} configured by a dataset's {@code options}; errors name the format and option. */
  public static Format create(String name, FormatOptions options) {
    Function<FormatOptions, Format> f = BY_NAME.get(name);
    if (f == null) {
      throw new IllegalArgumentException(
          "unknown format '" + name + "'; supported formats: " + String.join(", ", BY_NAME.keySet()));
    }
    return f.apply(options.forFormat(name));
  }
}
