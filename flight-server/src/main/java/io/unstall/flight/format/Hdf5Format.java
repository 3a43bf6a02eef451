package io.unstall.flight.format;

import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.jhdf.HdfFile;
import io.jhdf.api.Dataset;
import io.jhdf.api.dataset.ContiguousDataset;
import io.jhdf.dataset.chunked.Chunk;
import io.jhdf.dataset.chunked.ChunkOffset;
import io.jhdf.dataset.chunked.ChunkedDatasetBase;
import io.jhdf.filter.PipelineFilterWithData;
import io.jhdf.object.datatype.DataType;
import io.jhdf.object.datatype.FixedPoint;
import io.jhdf.object.datatype.FloatingPoint;
import io.jhdf.object.message.DataLayout;
import io.unstall.flight.storage.Storage;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.lang.reflect.Array;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.function.LongConsumer;
import java.util.zip.DataFormatException;
import java.util.zip.Inflater;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.OutOfMemoryException;

/**
 * HDF5 files (a file, or a directory of {@code *.h5}/{@code *.hdf5}): the first axis of one HDF5 dataset as the
 * samples, in file order. Options: {@code dataset} (its path in the file, required) and {@code label} (the path
 * of a one-dimensional integer dataset of the same length). The payload of sample {@code i} is row {@code i}'s
 * bytes as stored (C order, the file's byte order); the index's layout carries the numpy
 * dtype and the row's shape, so Python returns what {@code h5py}'s {@code dset[i]} returns.
 *
 * <p>jHDF reads the file's metadata at indexing (object headers, the chunk index), through the dataset's
 * {@link Storage}: a local file or an S3 object alike, by ranged reads, never staged whole. Reads then go
 * straight to storage: a contiguous dataset's row is one ranged read (neighbours coalesced); a chunked
 * dataset's row is cut from the chunks that hold it, each read whole, unfiltered (deflate, shuffle) once and
 * kept for the neighbouring rows in the dataset's allocator ({@link DecodedUnits}).
 */
final class Hdf5Format implements Format {
  private static final int DEFLATE = 1;
  private static final int SHUFFLE = 2;
  /** HDF5 chunks are usually a MiB or less; one larger than this (or a corrupt size) is refused, not allocated. */
  private static final long MAX_CHUNK = 1L << 30;

  /** One file's layout of the dataset. */
  private record Layout(long rows, long address, int[] chunkDims, Map<ChunkOffset, Chunk> chunks,
      List<PipelineFilterWithData> filters) {
    boolean contiguous() {
      return chunkDims == null;
    }
  }

  private final String path;
  private final String labelPath;
  private String dataset;
  private DecodedUnits<ChunkKey, ArrowBuf> units;
  private final Map<String, Integer> fileNos = new HashMap<>();
  private final List<String> files = new ArrayList<>();
  private final List<Layout> layouts = new ArrayList<>();
  private Storage storage;
  private String dtype;
  private int elementSize;
  private long[] dims; // of the first file; rows vary per file
  private int rowBytes;

  private record ChunkKey(int fileNo, ChunkOffset offset) {}

  Hdf5Format(FormatOptions options) {
    options.allow("dataset", "label");
    this.path = options.string("dataset", null);
    if (path == null) {
      throw options.problem("dataset", "is required: the path of the HDF5 dataset whose first axis holds the samples");
    }
    this.labelPath = options.string("label", null);
  }

  @Override
  public String name() {
    return "hdf5";
  }

  @Override
  public void decodeIn(String dataset, BufferAllocator memory) {
    java.util.Objects.requireNonNull(memory, "no allocator for decoded units (DatasetRegistry.decodeFormatsIn)");
    this.dataset = dataset;
    this.units = new DecodedUnits<>(memory, "hdf5 " + dataset, this::decodeChunk);
  }

  @Override
  public boolean coalesces() {
    return layouts.stream().allMatch(Layout::contiguous);
  }

  @Override
  public SampleIndex index(Storage storage, LongConsumer progress) throws IOException {
    this.storage = storage;
    List<String> found = storage.isSingleObject() ? storage.listObjects("")
        : storage.listObjects("").stream().filter(Hdf5Format::isHdf5).toList();
    if (found.isEmpty()) {
      throw new FileNotFoundException("no HDF5 files (*.h5, *.hdf5) in " + storage.uri());
    }
    SampleIndex.Builder b = new SampleIndex.Builder(labelPath != null);
    for (String file : found) {
      int fileNo = b.file(file);
      fileNos.put(file, fileNo);
      files.add(file);
      long size = storage.pin(file);
      long[] labels;
      Layout layout;
      try (HdfFile hdf = new HdfFile(new StorageChannel(storage, file, size, 256 << 10), uri(file))) {
        Dataset d = node(hdf, path, file);
        layout = layout(d, file, size);
        labels = labelPath == null ? null : labels(node(hdf, labelPath, file), layout.rows(), file);
      } catch (IOException | IllegalArgumentException e) {
        throw e;
      } catch (RuntimeException e) { // jHDF's HdfException and friends: the file's structure is bad
        CorruptRecordException c = new CorruptRecordException(storage.describe(file), -1,
            "dataset '" + dataset + "': corrupt or truncated HDF5"
            + " file '" + storage.describe(file) + "' (" + size + " bytes): " + e);
        c.initCause(e);
        throw c;
      }
      layouts.add(layout);
      for (long r = 0; r < layout.rows(); r++) {
        long offset = layout.contiguous() ? layout.address() + r * rowBytes : r;
        b.add(fileNo, offset, rowBytes, labels == null ? -1 : labels[(int) r]);
        progress.accept(b.size());
      }
    }
    return b.layout(layout().toString()).build();
  }

  /** jHDF names a channel's file by a URI with a path (messages only; it opens nothing). */
  private static java.net.URI uri(String file) throws IOException {
    try {
      return new java.net.URI("unstall", null, "/" + file, null);
    } catch (java.net.URISyntaxException e) {
      throw new IOException(e);
    }
  }

  private Dataset node(HdfFile hdf, String p, String file) {
    io.jhdf.api.Node n;
    try {
      n = hdf.getByPath(p);
    } catch (io.jhdf.exceptions.HdfInvalidPathException e) {
      n = null;
    }
    if (!(n instanceof Dataset d)) {
      throw new IllegalArgumentException("dataset '" + dataset + "': HDF5 file '" + storage.describe(file)
          + "' has no dataset at '" + p + "'" + (n == null ? "" : " (it is a " + n.getType() + ")"));
    }
    return d;
  }

  private Layout layout(Dataset d, String file, long size) throws IOException {
    long[] ds = d.getDimensionsAsLong();
    if (ds.length == 0) {
      throw new IllegalArgumentException("dataset '" + dataset + "': '" + path + "' in '" + storage.describe(file)
          + "' is a scalar; its first axis must hold the samples");
    }
    String dt = dtype(d.getDataType(), file);
    long row = d.getDataType().getSize();
    for (int i = 1; i < ds.length; i++) {
      row *= ds[i];
    }
    if (row > Integer.MAX_VALUE - 8) {
      throw new IllegalArgumentException("dataset '" + dataset + "': a row of '" + path + "' is " + row + " bytes;"
          + " samples must be < 2 GiB");
    }
    if (dims == null) {
      dims = ds;
      dtype = dt;
      elementSize = d.getDataType().getSize();
      rowBytes = (int) row;
    } else if (!dt.equals(dtype) || !Arrays.equals(Arrays.copyOfRange(ds, 1, ds.length),
        Arrays.copyOfRange(dims, 1, dims.length))) {
      throw new IllegalArgumentException("dataset '" + dataset + "': '" + path + "' in '" + storage.describe(file)
          + "' has rows of " + dt + " " + Arrays.toString(Arrays.copyOfRange(ds, 1, ds.length)) + ", the first file's "
          + dtype + " " + Arrays.toString(Arrays.copyOfRange(dims, 1, dims.length)) + "; all files must agree");
    }
    String where = "'" + path + "' in HDF5 file '" + storage.describe(file) + "' (" + size + " bytes)";
    if (d.getDataLayout() == DataLayout.CONTIGUOUS && d instanceof ContiguousDataset c) {
      long address = c.getDataAddress();
      long end = address + ds[0] * row;
      if (ds[0] > 0 && (address < 0 || end > size)) {
        throw new CorruptRecordException(storage.describe(file), address,
            "dataset '" + dataset + "': truncated HDF5 file: the data of " + where
            + " lies at byte offset " + address + ".." + end + ", past the end of the file");
      }
      return new Layout(ds[0], address, null, null, List.of());
    }
    if (d.getDataLayout() == DataLayout.CHUNKED && d instanceof ChunkedDatasetBase c) {
      List<PipelineFilterWithData> filters = c.getFilters();
      for (PipelineFilterWithData f : filters) {
        if (f.getId() != DEFLATE && f.getId() != SHUFFLE) {
          throw new IllegalArgumentException("dataset '" + dataset + "': " + where + " uses the HDF5 filter '"
              + f.getName() + "' (id " + f.getId() + "); the sidecar reads chunks filtered with gzip (deflate) and"
              + " shuffle only");
        }
      }
      long chunkBytes = d.getDataType().getSize();
      for (int cd : c.getChunkDimensions()) {
        chunkBytes *= cd;
      }
      if (chunkBytes > MAX_CHUNK) {
        throw new IllegalArgumentException("dataset '" + dataset + "': " + where + " has chunks of " + chunkBytes
            + " bytes; the sidecar reads chunks of at most " + MAX_CHUNK);
      }
      Map<ChunkOffset, Chunk> chunks = chunkLookup(c);
      for (Chunk ch : chunks.values()) {
        if (ch.getAddress() < 0 || ch.getSize() < 0 || ch.getSize() > MAX_CHUNK
            || ch.getAddress() + ch.getSize() > size) {
          throw new CorruptRecordException(storage.describe(file), ch.getAddress(),
              "dataset '" + dataset + "': truncated HDF5 file: chunk "
              + Arrays.toString(ch.getChunkOffset()) + " of " + where + " lies at byte offset " + ch.getAddress()
              + ".." + (ch.getAddress() + ch.getSize()) + ", past the end of the file");
        }
      }
      return new Layout(ds[0], -1, c.getChunkDimensions(), chunks, filters);
    }
    throw new IllegalArgumentException("dataset '" + dataset + "': " + where + " has the " + d.getDataLayout()
        + " layout; the sidecar reads contiguous and chunked datasets");
  }

  /** jHDF keeps its chunk index (offset -> address, size, filter mask) behind a protected method. */
  @SuppressWarnings("unchecked")
  private static Map<ChunkOffset, Chunk> chunkLookup(ChunkedDatasetBase c) throws IOException {
    try {
      java.lang.reflect.Method m = ChunkedDatasetBase.class.getDeclaredMethod("getChunkLookup");
      m.setAccessible(true);
      return Map.copyOf((Map<ChunkOffset, Chunk>) m.invoke(c));
    } catch (java.lang.reflect.InvocationTargetException e) {
      if (e.getCause() instanceof RuntimeException r) {
        throw r;
      }
      throw new IOException(e.getCause());
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException("this jHDF has no chunk index accessor: " + e, e);
    }
  }

  private String dtype(DataType t, String file) {
    String order = t.getSize() == 1 ? "|" : null;
    if (t instanceof FixedPoint f) {
      order = order != null ? order : f.getByteOrder() == ByteOrder.LITTLE_ENDIAN ? "<" : ">";
      return order + (f.isSigned() ? "i" : "u") + t.getSize();
    }
    if (t instanceof FloatingPoint f && (t.getSize() == 2 || t.getSize() == 4 || t.getSize() == 8)) {
      order = order != null ? order : f.getByteOrder() == ByteOrder.LITTLE_ENDIAN ? "<" : ">";
      return order + "f" + t.getSize();
    }
    throw new IllegalArgumentException("dataset '" + dataset + "': '" + path + "' in HDF5 file '"
        + storage.describe(file) + "' holds " + t.getClass().getSimpleName() + " values; the sidecar reads integer and"
        + " floating-point datasets");
  }

  private long[] labels(Dataset d, long rows, String file) {
    long[] ds = d.getDimensionsAsLong();
    boolean oneColumn = ds.length == 2 && ds[1] == 1;
    if (!(d.getDataType() instanceof FixedPoint) || !(ds.length == 1 || oneColumn) || ds[0] != rows) {
      throw new IllegalArgumentException("dataset '" + dataset + "': the label dataset '" + labelPath + "' in '"
          + storage.describe(file) + "' must hold " + rows + " integers (one per row of '" + path + "'), it is "
          + d.getJavaType().getSimpleName() + " " + Arrays.toString(ds));
    }
    Object flat = d.getDataFlat();
    long[] out = new long[(int) rows];
    for (int i = 0; i < out.length; i++) {
      out[i] = ((Number) Array.get(flat, i)).longValue();
    }
    return out;
  }

  @Override
  public String key(SampleIndex index, int id) {
    String file = index.file(id);
    Layout l = layouts.get(fileNos.get(file));
    long row = l.contiguous() ? (index.offset(id) - l.address()) / Math.max(1, rowBytes) : index.offset(id);
    return file + ":" + path + "[" + row + "]";
  }

  @Override
  public void read(Storage storage, SampleIndex index, int id, ByteBuffer dst) throws IOException {
    int fileNo = fileNos.get(index.file(id));
    Layout l = layouts.get(fileNo);
    if (l.contiguous()) {
      storage.readFully(index.file(id), index.offset(id), dst);
      return;
    }
    readChunked(fileNo, l, index.offset(id), dst);
  }

  /** Row {@code row} cut from the chunks of its slab along the first axis, in C order. */
  private void readChunked(int fileNo, Layout l, long row, ByteBuffer dst) throws IOException {
    int n = dims.length;
    int[] c = l.chunkDims();
    long[] grid = new long[n]; // chunks along each axis
    for (int i = 1; i < n; i++) {
      grid[i] = (dims[i] + c[i] - 1) / c[i];
    }
    int base = dst.position();
    long[] at = new long[n]; // the chunk's element offset
    at[0] = row / c[0] * c[0];
    long slab = 1;
    for (int i = 1; i < n; i++) {
      slab *= grid[i];
    }
    for (long k = 0; k < slab; k++) {
      long rest = k;
      for (int i = n - 1; i >= 1; i--) {
        at[i] = (rest % grid[i]) * c[i];
        rest /= grid[i];
      }
      ChunkOffset key = new ChunkOffset(at.clone());
      Chunk chunk = l.chunks().get(key);
      if (chunk == null) { // never written: the fill value (h5py's default, zeros)
        copyFromChunk(null, c, at, row, dst, base);
        continue;
      }
      long bytes = (long) elementSize;
      for (int ci : c) {
        bytes *= ci;
      }
      try (DecodedUnits<ChunkKey, ArrowBuf>.Lease unit = units.get(new ChunkKey(fileNo, key), bytes)) {
        copyFromChunk(unit.value(), c, at, row, dst, base);
      }
    }
    dst.position(base + rowBytes);
  }

  /** Copies the part of row {@code row} inside the chunk at {@code at} (null: zeros) to its place in the row. */
  private void copyFromChunk(ArrowBuf chunk, int[] c, long[] at, long row, ByteBuffer dst, int base) {
    int n = dims.length;
    long[] count = new long[n];
    for (int i = 1; i < n; i++) {
      count[i] = Math.min(c[i], dims[i] - at[i]);
    }
    int run = (int) ((n == 1 ? 1 : count[n - 1]) * elementSize);
    long runs = 1;
    for (int i = 1; i < n - 1; i++) {
      runs *= count[i];
    }
    long[] idx = new long[n];
    for (long k = 0; k < runs; k++) {
      long rest = k;
      for (int i = n - 2; i >= 1; i--) {
        idx[i] = rest % count[i];
        rest /= count[i];
      }
      long src = row - at[0]; // element offset in the chunk, C order
      long out = 0; // element offset in the row, C order
      for (int i = 1; i < n; i++) {
        long j = i == n - 1 ? 0 : idx[i];
        src = src * c[i] + j;
        out = out * dims[i] + at[i] + j;
      }
      int to = base + (int) (out * elementSize);
      if (chunk == null) {
        dst.put(to, new byte[run]);
      } else {
        chunk.getBytes(src * elementSize, dst.duplicate().position(to).limit(to + run));
      }
    }
  }

  /** Reads one chunk whole and undoes its filters (deflate, shuffle), into {@code into}. */
  private ArrowBuf decodeChunk(ChunkKey key, BufferAllocator into) throws IOException {
    Layout l = layouts.get(key.fileNo());
    Chunk chunk = l.chunks().get(key.offset());
    String file = files.get(key.fileNo());
    long bytes = elementSize;
    for (int ci : l.chunkDims()) {
      bytes *= ci;
    }
    byte[] data = new byte[chunk.getSize()];
    storage.readFully(file, chunk.getAddress(), ByteBuffer.wrap(data));
    List<PipelineFilterWithData> filters = l.filters();
    try {
      for (int i = filters.size() - 1; i >= 0; i--) {
        if (chunk.getFilterMask() != null && chunk.getFilterMask().get(i)) {
          continue; // this filter was skipped for this chunk
        }
        data = filters.get(i).getId() == DEFLATE ? inflate(data, bytes) : unshuffle(data, elementSize);
      }
      if (data.length != bytes) {
        throw new DataFormatException("it unfilters to " + data.length + " bytes, a chunk is " + bytes);
      }
    } catch (DataFormatException e) {
      throw new CorruptRecordException(storage.describe(file), chunk.getAddress(),
          "dataset '" + dataset + "': corrupt HDF5 chunk "
          + Arrays.toString(chunk.getChunkOffset()) + " of '" + path + "' in '" + storage.describe(file)
          + "' at byte offset " + chunk.getAddress() + " (" + chunk.getSize() + " bytes): " + e.getMessage());
    }
    try {
      ArrowBuf buf = into.buffer(bytes);
      buf.setBytes(0, data);
      return buf;
    } catch (OutOfMemoryException e) {
      throw new DecodedUnits.NoRoom("dataset '" + dataset + "': an HDF5 chunk of '" + path + "' (" + bytes
          + " bytes) does not fit in the memory for decoded chunks (" + into.getLimit() + " bytes)", e);
    }
  }

  private static byte[] inflate(byte[] in, long bytes) throws DataFormatException {
    Inflater inf = new Inflater();
    try {
      inf.setInput(in);
      byte[] out = new byte[(int) bytes];
      int n = 0;
      while (!inf.finished()) {
        int k = inf.inflate(out, n, out.length - n);
        n += k;
        if (k == 0 && (inf.needsInput() || inf.needsDictionary() || n == out.length) && !inf.finished()) {
          throw new DataFormatException("the deflate stream ends early, after " + n + " of " + bytes + " bytes");
        }
      }
      return n == out.length ? out : Arrays.copyOf(out, n);
    } finally {
      inf.end();
    }
  }

  /** HDF5's shuffle filter stores byte k of every element together; this puts them back. */
  private static byte[] unshuffle(byte[] in, int size) {
    if (size <= 1) {
      return in;
    }
    int elements = in.length / size;
    byte[] out = in.clone(); // a trailing partial element stays as stored
    for (int b = 0; b < size; b++) {
      for (int e = 0; e < elements; e++) {
        out[e * size + b] = in[b * elements + e];
      }
    }
    return out;
  }

  /** The address and stored size of the first chunk of row {@code row}'s slab (of the first file): for tests. */
  long[] chunkOf(long row) {
    Layout l = layouts.get(0);
    long[] at = new long[dims.length];
    at[0] = row / l.chunkDims()[0] * l.chunkDims()[0];
    Chunk c = l.chunks().get(new ChunkOffset(at));
    return new long[] {c.getAddress(), c.getSize()};
  }

  /** What the Python decoder needs (numpy's dtype and the row's shape): the index carries it as its layout. */
  private ObjectNode layout() {
    ObjectNode o = JsonNodeFactory.instance.objectNode();
    o.put("dtype", dtype);
    var shape = o.putArray("shape");
    for (int i = 1; i < dims.length; i++) {
      shape.add(dims[i]);
    }
    o.put("dataset", path);
    if (labelPath != null) {
      o.put("label", labelPath);
    }
    return o;
  }

  @Override
  public void close() {
    if (units != null) {
      units.close();
    }
  }

  private static boolean isHdf5(String p) {
    String name = p.substring(p.lastIndexOf('/') + 1).toLowerCase(java.util.Locale.ROOT);
    return !name.startsWith(".") && (name.endsWith(".h5") || name.endsWith(".hdf5") || name.endsWith(".hdf"));
  }
}
