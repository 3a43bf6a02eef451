package io.unstall.flight.format;

import io.unstall.flight.storage.Storage;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;

/**
 * A format whose samples lie inside files of one kind (tar shards, arrays, CSV files), found by their suffix and
 * indexed by reading inside them: its index is worth persisting, and a sample's key is where it starts.
 */
interface ContentIndexed extends Format {

  @Override
  default boolean persistsIndex() {
    return true;
  }

  @Override
  default String key(SampleIndex index, int id) {
    return index.file(id) + "@" + index.offset(id);
  }

  /**
   * The objects under the root ending in {@code suffix} (a root that is one object: that object, whatever its
   * name), in path order, less {@code except}; none is an error naming the location.
   */
  static List<String> files(Storage storage, String suffix, String except) throws IOException {
    List<String> out = new ArrayList<>();
    for (String p : storage.listObjects("")) {
      if ((storage.isSingleObject() || p.endsWith(suffix)) && !p.equals(except)) {
        out.add(p);
      }
    }
    if (out.isEmpty()) {
      throw new FileNotFoundException("no " + suffix + " files in " + storage.uri());
    }
    return out;
  }
}
