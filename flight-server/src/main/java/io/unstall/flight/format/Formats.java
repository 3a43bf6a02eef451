package io.unstall.flight.format;

import java.util.Map;
import java.util.TreeMap;

/** The formats a dataset can be registered with, by name. */
public final class Formats {
  private static final Map<String, Format> BY_NAME = new TreeMap<>();

  static {
    for (Format f : new Format[] {new ImageFolderFormat(), new TfRecordFormat(), new ParquetFormat(), new Hdf5Format()}) {
      BY_NAME.put(f.name(), f);
    }
  }

  private Formats() {}

  public static Format byName(String name) {
    Format f = BY_NAME.get(name);
    if (f == null) {
      throw new IllegalArgumentException(
          "unknown format '" + name + "'; supported formats: " + String.join(", ", BY_NAME.keySet()));
    }
    return f;
  }
}
