package io.unstall.flight.format;

import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.storage.Storage;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.List;
import java.util.TreeMap;
import java.util.function.LongConsumer;
import org.apache.commons.compress.archivers.zip.ZipArchiveEntry;
import org.apache.commons.compress.archivers.zip.ZipFile;

/**
 * numpy arrays, a sample per row along the first axis: {@code npy} reads {@code .npy} files (the root, or every
 * {@code .npy} file of a directory in path order, rows concatenated: shards of one array), {@code npz} reads one
 * array of {@code .npz} archives ({@code numpy.savez}; option {@code array}, needed when an archive holds several).
 * A sample is exactly one row's bytes, so a read is one ranged request of a row (neighbouring rows coalesce), and
 * the client makes it an array of the layout's dtype and row shape. Option {@code label}: a 1-D integer array of a
 * label per row (npy: the path of a {@code .npy} file under the root, left out of the data; npz: the name of an
 * array in each archive). A member of an npz must be stored, not compressed ({@code numpy.savez_compressed}), to be
 * read by rows; compressed label arrays are read whole. Every file must hold the same dtype and row shape.
 */
public final class NpyFormat implements ContentIndexed {
  private static final int MAX_LABELS_BYTES = 1 << 30;

  private final boolean zip;
  private final String array;
  private final String label;

  private NpyFormat(boolean zip, String array, String label) {
    this.zip = zip;
    this.array = array;
    this.label = label;
  }

  static NpyFormat npy(FormatOptions options) {
    options.allow("label");
    return new NpyFormat(false, null, options.string("label", null));
  }

  static NpyFormat npz(FormatOptions options) {
    options.allow("array", "label");
    return new NpyFormat(true, stripNpy(options.string("array", null)), stripNpy(options.string("label", null)));
  }

  @Override
  public String name() {
    return zip ? "npz" : "npy";
  }

  @Override
  public SampleIndex index(Storage storage, LongConsumer progress) throws IOException {
    List<String> files = ContentIndexed.files(storage, zip ? ".npz" : ".npy", zip ? null : label);
    List<Located> found = new ArrayList<>();
    List<Long> labels = new ArrayList<>();
    long rows = 0;
    for (String f : files) {
      long size = storage.pin(f);
      StorageChannel ch = new StorageChannel(storage, f, size, 64 << 10);
      Located at = zip ? inZip(storage, f, ch, labels) : new Located(0, size, header(storage, f, ch, 0, size));
      NpyHeader h = at.header;
      NpyHeader first = found.isEmpty() ? h : found.get(0).header;
      if (!first.descr().equals(h.descr()) || !rowShape(first).equals(rowShape(h))) {
        throw new IllegalArgumentException("format '" + name() + "': '" + storage.describe(f) + "' holds rows of "
            + describe(h) + " but '" + storage.describe(files.get(0)) + "' of " + describe(first));
      }
      long expected = h.dataOffset() + h.dataBytes();
      if (at.length != expected) {
        long whole = Math.min(h.rows(), Math.max(0, (at.length - h.dataOffset()) / Math.max(1, h.rowBytes())));
        long cut = at.offset + h.dataOffset() + whole * h.rowBytes();
        throw new CorruptRecordException(storage.describe(f), cut, "corrupt " + name() + " file '"
            + storage.describe(f) + "' at byte offset " + cut + ": the array has " + at.length + " bytes but its"
            + " header says " + h.rows() + " rows of " + h.rowBytes() + " bytes after a " + h.dataOffset()
            + "-byte header (" + expected + " bytes)" + (at.length < expected ? ": truncated" : ""));
      }
      found.add(at);
      rows += h.rows();
      progress.accept(rows);
    }
    if (label != null && !zip) {
      if (storage.isSingleObject() || !storage.listObjects("").contains(label)) {
        throw new FileNotFoundException("format 'npy': option 'label' names '" + label + "', which is not a file under "
            + storage.uri() + (storage.isSingleObject() ? " (the label file lies beside the data: register the"
            + " directory)" : ""));
      }
      long size = storage.pin(label);
      readLabels(storage, label, new StorageChannel(storage, label, size, 64 << 10), 0, size, labels);
    }
    if (label != null && labels.size() != rows) {
      throw new IllegalArgumentException("format '" + name() + "': option 'label' gives " + labels.size()
          + " labels for " + rows + " rows");
    }
    NpyHeader h0 = found.get(0).header;
    ObjectNode layout = JsonNodeFactory.instance.objectNode().put("dtype", h0.descr());
    rowShape(h0).forEach(layout.putArray("shape")::add);
    if (label == null) {
      layout.putNull("label");
    } else {
      layout.put("label", label);
    }
    SampleIndex.Builder b = new SampleIndex.Builder(label != null).layout(layout.toString());
    int id = 0;
    for (int k = 0; k < files.size(); k++) {
      int fileNo = b.file(files.get(k));
      NpyHeader h = found.get(k).header;
      long start = found.get(k).offset + h.dataOffset();
      for (long r = 0; r < h.rows(); r++, id++) {
        b.add(fileNo, start + r * h.rowBytes(), h.rowBytes(), label == null ? -1 : labels.get(id));
      }
    }
    return b.build();
  }

  private static List<Long> rowShape(NpyHeader h) {
    return h.shape().subList(1, h.shape().size());
  }

  /** Where the data array of an npz lies, its labels appended to {@code labels}. */
  private Located inZip(Storage storage, String f, StorageChannel ch, List<Long> labels) throws IOException {
    try (ZipFile z = openZip(storage, f, ch)) {
      TreeMap<String, ZipArchiveEntry> members = new TreeMap<>();
      for (var e = z.getEntries(); e.hasMoreElements(); ) {
        ZipArchiveEntry m = e.nextElement();
        if (m.getName().endsWith(".npy")) {
          members.put(m.getName().substring(0, m.getName().length() - 4), m);
        }
      }
      String want = array;
      if (want == null) {
        var data = new TreeMap<>(members);
        if (label != null) {
          data.remove(label);
        }
        if (data.size() != 1) {
          throw new IllegalArgumentException("format 'npz': " + where(storage, f) + " holds the arrays "
              + String.join(", ", members.keySet()) + "; choose one with option 'array'");
        }
        want = data.firstKey();
      }
      ZipArchiveEntry m = member(storage, f, members, want, "array");
      if (m.getMethod() != ZipArchiveEntry.STORED) {
        throw new IllegalArgumentException("format 'npz': member '" + m.getName() + "' of " + where(storage, f)
            + " is compressed (method " + m.getMethod() + ", as numpy.savez_compressed writes), so its rows cannot be"
            + " read by ranged requests; save it with numpy.savez");
      }
      Located at = new Located(m.getDataOffset(), m.getSize(), header(storage, f, ch, m.getDataOffset(), m.getSize()));
      if (label != null) {
        ZipArchiveEntry l = member(storage, f, members, label, "label");
        if (l.getMethod() == ZipArchiveEntry.STORED) {
          readLabels(storage, f, ch, l.getDataOffset(), l.getSize(), labels);
        } else { // read whole: a label per row is small
          try (InputStream in = z.getInputStream(l)) {
            byte[] all = in.readNBytes(MAX_LABELS_BYTES);
            labels.addAll(labels(storage, f, all));
          }
        }
      }
      return at;
    }
  }

  private static ZipFile openZip(Storage storage, String f, StorageChannel ch) throws CorruptRecordException {
    try {
      return ZipFile.builder().setSeekableByteChannel(ch).get();
    } catch (IOException | RuntimeException e) { // commons-compress's view of a bad archive
      throw new CorruptRecordException(storage.describe(f), ch.position(), "corrupt npz file '"
          + storage.describe(f) + "' at byte offset " + ch.position() + ": not a readable zip archive (" + e + ")");
    }
  }

  private ZipArchiveEntry member(Storage storage, String f, TreeMap<String, ZipArchiveEntry> members, String name,
      String option) throws FileNotFoundException {
    ZipArchiveEntry m = members.get(name);
    if (m == null) {
      throw new FileNotFoundException("format 'npz': option '" + option + "' names the array '" + name + "', which "
          + where(storage, f) + " does not hold (it holds " + String.join(", ", members.keySet()) + ")");
    }
    return m;
  }

  /** The .npy header at {@code offset} of {@code f} (a member of {@code length} bytes). */
  private NpyHeader header(Storage storage, String f, StorageChannel ch, long offset, long length) throws IOException {
    try {
      byte[] prefix = new byte[(int) Math.min(NpyHeader.PREFIX_V2, length)];
      ch.readFully(offset, ByteBuffer.wrap(prefix));
      int total = NpyHeader.length(prefix);
      if (total > length) {
        throw new IllegalArgumentException("the header (" + total + " bytes) runs past its end: truncated");
      }
      byte[] all = new byte[total];
      ch.readFully(offset, ByteBuffer.wrap(all));
      NpyHeader h = NpyHeader.parse(all);
      h.dataBytes(); // a shape past what a row or a file can hold is this file's error, named with it
      return h;
    } catch (IllegalArgumentException e) {
      throw new CorruptRecordException(storage.describe(f), offset, "corrupt " + name() + " file '"
          + storage.describe(f) + "' at byte offset " + offset + ": " + e.getMessage());
    }
  }

  private void readLabels(Storage storage, String f, StorageChannel ch, long offset, long length, List<Long> out)
      throws IOException {
    if (length > MAX_LABELS_BYTES) {
      throw new IllegalArgumentException("format '" + name() + "': the label array in " + where(storage, f) + " has "
          + length + " bytes, more than a label per row needs");
    }
    byte[] all = new byte[(int) length];
    ch.readFully(offset, ByteBuffer.wrap(all));
    try {
      out.addAll(labels(storage, f, all));
    } catch (IllegalArgumentException e) {
      throw new CorruptRecordException(storage.describe(f), offset, "corrupt " + name() + " file '"
          + storage.describe(f) + "' at byte offset " + offset + ": " + e.getMessage());
    }
  }

  /** The labels of a whole .npy file's bytes: a 1-D array of integers. */
  private List<Long> labels(Storage storage, String f, byte[] npy) {
    NpyHeader h = NpyHeader.parse(npy);
    char kind = h.descr().charAt(1);
    if (h.shape().size() != 1 || (kind != 'i' && kind != 'u' && kind != 'b')) {
      throw new IllegalArgumentException("format '" + name() + "': option 'label' must name a 1-D integer array; "
          + where(storage, f) + " holds " + describe(h));
    }
    if (npy.length != h.dataOffset() + h.dataBytes()) {
      throw new IllegalArgumentException("the label array has " + (npy.length - h.dataOffset())
          + " bytes of data for " + h.rows() + " labels of " + h.itemSize() + " bytes: truncated");
    }
    ByteBuffer b = ByteBuffer.wrap(npy, h.dataOffset(), npy.length - h.dataOffset())
        .order(h.descr().charAt(0) == '>' ? ByteOrder.BIG_ENDIAN : ByteOrder.LITTLE_ENDIAN);
    List<Long> out = new ArrayList<>((int) h.rows());
    for (long r = 0; r < h.rows(); r++) {
      long v = switch (h.itemSize()) {
        case 1 -> kind == 'u' || kind == 'b' ? b.get() & 0xffL : b.get();
        case 2 -> kind == 'u' ? b.getShort() & 0xffffL : b.getShort();
        case 4 -> kind == 'u' ? b.getInt() & 0xffffffffL : b.getInt();
        case 8 -> b.getLong();
        default -> throw new IllegalArgumentException("label dtype '" + h.descr() + "' is not an integer type");
      };
      if (kind == 'u' && h.itemSize() == 8 && v < 0) {
        throw new IllegalArgumentException("label " + Long.toUnsignedString(v) + " does not fit a signed 64-bit label");
      }
      out.add(v);
    }
    return out;
  }


  private static String where(Storage storage, String f) {
    return "'" + storage.describe(f) + "'";
  }

  private static String describe(NpyHeader h) {
    return "dtype " + h.descr() + " and shape " + h.shape();
  }

  private static String stripNpy(String name) {
    return name != null && name.endsWith(".npy") ? name.substring(0, name.length() - 4) : name;
  }

  /** An array's .npy bytes inside a file: from {@code offset}, {@code length} bytes, with their header. */
  private record Located(long offset, long length, NpyHeader header) {}
}
