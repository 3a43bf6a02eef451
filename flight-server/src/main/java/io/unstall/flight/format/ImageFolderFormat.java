package io.unstall.flight.format;

import io.unstall.flight.storage.Storage;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Locale;
import java.util.function.LongConsumer;

/**
 * torchvision's ImageFolder layout: one subdirectory per class, label = index of the class in sorted order,
 * samples in exactly the order torchvision lists them (class, then directory walk order, then file name), so
 * sample id {@code i} here is {@code ImageFolder(root).samples[i]}.
 */
public final class ImageFolderFormat implements Format {
  /** torchvision.datasets.folder.IMG_EXTENSIONS. */
  public static final List<String> IMG_EXTENSIONS =
      List.of(".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp");

  /** os.walk order: files of a directory before those of its subdirectories, each group sorted by name. */
  private static final Comparator<String> WALK_ORDER =
      Comparator.comparing(ImageFolderFormat::parent).thenComparing(ImageFolderFormat::name);

  @Override
  public String name() {
    return "imagefolder";
  }

  @Override
  public List<String> classes(Storage storage) throws IOException {
    if (storage.isSingleObject()) {
      throw new IllegalArgumentException(
          "imagefolder needs a directory with one subdirectory per class, got the file " + storage.uri());
    }
    List<String> classes = storage.listDirectories("");
    if (classes.isEmpty()) {
      throw new FileNotFoundException("Couldn't find any class folder in " + storage.uri());
    }
    return classes;
  }

  @Override
  public SampleIndex index(Storage storage, LongConsumer progress) throws IOException {
    List<String> classes = classes(storage);
    SampleIndex.Builder b = new SampleIndex.Builder(true);
    List<String> empty = new ArrayList<>();
    for (int label = 0; label < classes.size(); label++) {
      List<String> files = new ArrayList<>();
      for (String f : storage.listObjects(classes.get(label))) {
        if (isImage(f)) {
          files.add(f);
        }
      }
      if (files.isEmpty()) {
        empty.add(classes.get(label));
      }
      files.sort(WALK_ORDER);
      for (String f : files) {
        b.add(b.file(f), 0, storage.pin(f), label);
        progress.accept(b.size());
      }
    }
    if (!empty.isEmpty()) {
      throw new FileNotFoundException(
          "Found no valid file for the classes " + String.join(", ", empty) + " in " + storage.uri()
              + ". Supported extensions are: " + String.join(", ", IMG_EXTENSIONS));
    }
    return b.build();
  }

  static boolean isImage(String path) {
    String lower = path.toLowerCase(Locale.ROOT);
    for (String ext : IMG_EXTENSIONS) {
      if (lower.endsWith(ext)) {
        return true;
      }
    }
    return false;
  }

  private static String parent(String path) {
    int slash = path.lastIndexOf('/');
    return slash < 0 ? "" : path.substring(0, slash);
  }

  private static String name(String path) {
    return path.substring(path.lastIndexOf('/') + 1);
  }
}
