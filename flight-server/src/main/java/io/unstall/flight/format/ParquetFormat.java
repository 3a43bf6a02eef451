package io.unstall.flight.format;

import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.storage.Storage;
import java.io.ByteArrayOutputStream;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.Channels;
import java.nio.channels.WritableByteChannel;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.function.LongConsumer;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.OutOfMemoryException;
import org.apache.arrow.vector.BaseIntVector;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.VectorUnloader;
import org.apache.arrow.vector.complex.ListVector;
import org.apache.arrow.vector.ipc.WriteChannel;
import org.apache.arrow.vector.ipc.message.ArrowRecordBatch;
import org.apache.arrow.vector.ipc.message.IpcOption;
import org.apache.arrow.vector.ipc.message.MessageSerializer;
import org.apache.arrow.vector.types.pojo.Schema;
import org.apache.parquet.ParquetReadOptions;
import org.apache.parquet.UnstallReadOptions;
import org.apache.parquet.column.page.PageReadStore;
import org.apache.parquet.hadoop.ParquetFileReader;
import org.apache.parquet.hadoop.metadata.BlockMetaData;
import org.apache.parquet.hadoop.metadata.ColumnChunkMetaData;
import org.apache.parquet.hadoop.metadata.ParquetMetadata;
import org.apache.parquet.schema.MessageType;
import org.apache.parquet.schema.Type;

/**
 * Parquet files (a file, or a directory of {@code *.parquet}): one sample per row, in file order then row order.
 * Options: {@code columns} (the payload's columns; default every column but the label) and {@code label} (an
 * integer column, served as the sample's label). The payload of a row is one Arrow IPC record batch message of
 * one row (the schema is sent once, in the index's layout, {@code arrow_schema}); Python turns it
 * into a dict, as {@code pyarrow.Table.to_pylist()} does.
 *
 * <p>parquet-java reads and decodes (footer, pages, codecs, encodings, levels), through the dataset's
 * {@link Storage}. A row group is the unit of reading: a sample's read fetches its row group's chunks of the
 * chosen columns in one ranged request, decodes them into Arrow vectors held in the dataset's allocator, and
 * serves the neighbouring rows from them ({@link DecodedUnits}). Indexing decodes every row group once: a row's
 * payload size is only known decoded.
 */
final class ParquetFormat implements Format {
  private static final ParquetReadOptions OPTIONS = UnstallReadOptions.of(ParquetCodecs.INSTANCE);

  private final List<String> requested; // null: every column but the label
  private final String label;
  private final RowMessages rowMessages = new RowMessages();
  private String dataset;
  private DecodedUnits<Long, VectorSchemaRoot> units;
  // Set by index() (or, for an index loaded from disk, on the first read), read by read():
  private final Map<String, Integer> fileNos = new HashMap<>();
  private final List<String> files = new ArrayList<>();
  private final List<ParquetMetadata> footers = new ArrayList<>();
  private final List<long[]> groupStarts = new ArrayList<>();
  private final List<Long> sizes = new ArrayList<>();
  private List<String> columns;
  private List<ParquetColumns.Column> payload;
  private Schema schema;
  private Storage storage;
  private volatile boolean opened; // the lists above are complete

  ParquetFormat(FormatOptions options) {
    options.allow("columns", "label");
    List<String> cols = options.strings("columns");
    this.requested = cols.isEmpty() ? null : cols;
    this.label = options.string("label", null);
  }

  @Override
  public String name() {
    return "parquet";
  }

  @Override
  public void decodeIn(String dataset, BufferAllocator memory) {
    java.util.Objects.requireNonNull(memory, "no allocator for decoded units (DatasetRegistry.decodeFormatsIn)");
    this.dataset = dataset;
    this.units = new DecodedUnits<>(memory, "parquet " + dataset, this::decodeUnit);
  }

  @Override
  public boolean coalesces() {
    return false;
  }

  /** Forgets what an earlier index or restore of this instance kept (a restore that failed half-way). */
  private void reset(Storage storage) {
    this.storage = storage;
    fileNos.clear();
    files.clear();
    footers.clear();
    groupStarts.clear();
    sizes.clear();
    columns = null;
    payload = null;
    schema = null;
    opened = false;
    rowMessages.close(); // one-row roots of an earlier schema
  }

  @Override
  public SampleIndex index(Storage storage, LongConsumer progress) throws IOException {
    reset(storage);
    List<String> files = storage.isSingleObject() ? storage.listObjects("")
        : storage.listObjects("").stream().filter(ParquetFormat::isParquet).toList();
    if (files.isEmpty()) {
      throw new FileNotFoundException("no Parquet files (*.parquet) in " + storage.uri());
    }
    SampleIndex.Builder b = new SampleIndex.Builder(label != null);
    for (String file : files) {
      int fileNo = b.file(file);
      List<ParquetColumns.Column> decoded = openFile(fileNo, file, storage.pin(file));
      List<String> all = new ArrayList<>(columns);
      if (label != null && !all.contains(label)) {
        all.add(label);
      }
      long[] starts = groupStarts.get(fileNo);
      for (int g = 0; g < starts.length - 1; g++) {
        try (VectorSchemaRoot root = decode(fileNo, g, all, decoded, units.memory())) {
          FieldVector labels = label == null ? null : root.getVector(label);
          for (int row = 0; row < root.getRowCount(); row++) {
            long lab = -1;
            if (labels != null) {
              if (labels.isNull(row)) {
                throw new IllegalArgumentException("dataset '" + dataset + "': the label column '" + label + "' is null"
                    + " in row " + (starts[g] + row) + " of Parquet file '" + storage.describe(file) + "'");
              }
              lab = ((BaseIntVector) labels).getValueAsLong(row);
            }
            b.add(fileNo, starts[g] + row, rowMessages.size(payloadVectors(root), row), lab);
            progress.accept(b.size());
          }
        }
      }
    }
    opened = true;
    return b.layout(layout().toString()).build();
  }

  @Override
  public boolean persistsIndex() {
    return true; // indexing decoded every row group
  }

  /** An index loaded from disk (not built here): the footers are read on the first read, not the row groups. */
  private synchronized void openFiles(Storage storage, SampleIndex index) throws IOException {
    if (!opened) {
      reset(storage);
      for (int fileNo = 0; fileNo < index.files().size(); fileNo++) {
        openFile(fileNo, index.files().get(fileNo), storage.size(index.files().get(fileNo)));
      }
      opened = true;
    }
  }

  /**
   * Reads file {@code fileNo}'s footer, checks its columns against the options (and the first file's), and keeps
   * what reads need: the footer, where each row group starts. Returns the columns to decode at indexing (the
   * payload's and the label).
   */
  private List<ParquetColumns.Column> openFile(int fileNo, String file, long size) throws IOException {
    fileNos.put(file, fileNo);
    this.files.add(file);
    sizes.add(size);
    ParquetMetadata footer;
    try (ParquetFileReader r = new ParquetFileReader(new StorageInputFile(storage, file, size), OPTIONS)) {
      footer = r.getFooter();
    } catch (IOException | RuntimeException e) {
      throw corrupt(file, size, -1, "its footer (the last 8 bytes and the metadata before them)", e);
    }
    MessageType fileSchema = footer.getFileMetaData().getSchema();
    chooseColumns(fileSchema, storage.describe(file));
    List<String> all = new ArrayList<>(columns);
    if (label != null && !all.contains(label)) {
      all.add(label);
    }
    List<ParquetColumns.Column> decoded = ParquetColumns.choose(fileSchema, all, storage.describe(file));
    if (label != null) {
      checkLabel(decoded.get(all.indexOf(label)), file);
    }
    footers.add(footer);
    List<BlockMetaData> groups = footer.getBlocks();
    long[] starts = new long[groups.size() + 1];
    for (int g = 0; g < groups.size(); g++) {
      starts[g + 1] = starts[g] + groups.get(g).getRowCount();
    }
    groupStarts.add(starts);
    return decoded;
  }

  private void chooseColumns(MessageType fileSchema, String file) {
    List<String> cols = requested;
    if (cols == null) {
      cols = fileSchema.getFields().stream().map(Type::getName).filter(c -> !c.equals(label)).toList();
    }
    List<ParquetColumns.Column> chosen = ParquetColumns.choose(fileSchema, cols, file);
    Schema s = ParquetColumns.schema(chosen);
    if (schema == null) {
      columns = cols;
      payload = chosen;
      schema = s;
    } else if (!schema.equals(s)) {
      throw new IllegalArgumentException("dataset '" + dataset + "': Parquet file '" + file + "' has the columns " + s
          + ", the dataset's first file " + schema + "; all files must agree");
    }
  }

  private void checkLabel(ParquetColumns.Column c, String file) {
    if (c.list() || !(c.field().getType() instanceof org.apache.arrow.vector.types.pojo.ArrowType.Int)) {
      throw new IllegalArgumentException("dataset '" + dataset + "': the label column '" + label + "' of Parquet file '"
          + storage.describe(file) + "' must hold integers, not " + c.field().getType());
    }
  }

  /** The payload's vectors of a decoded row group (indexing also decoded the label). */
  private List<FieldVector> payloadVectors(VectorSchemaRoot root) {
    return columns.stream().map(root::getVector).toList();
  }

  @Override
  public String key(SampleIndex index, int id) {
    return index.file(id) + "#" + index.offset(id);
  }

  @Override
  public void read(Storage storage, SampleIndex index, int id, ByteBuffer dst) throws IOException {
    if (!opened) {
      openFiles(storage, index);
    }
    int fileNo = fileNos.get(index.file(id));
    long row = index.offset(id);
    long[] starts = groupStarts.get(fileNo);
    int g = java.util.Arrays.binarySearch(starts, row);
    g = g >= 0 ? g : -g - 2;
    BlockMetaData block = footers.get(fileNo).getBlocks().get(g);
    try (DecodedUnits<Long, VectorSchemaRoot>.Lease unit =
        units.get(((long) fileNo << 32) | g, decodedEstimate(block))) {
      VectorSchemaRoot root = unit.value();
      int start = dst.position();
      rowMessages.write(root.getFieldVectors(), (int) (row - starts[g]), dst);
      if (dst.position() - start != index.length(id)) {
        throw new CorruptRecordException(storage.describe(index.file(id)), -1, "Parquet file '"
            + storage.describe(index.file(id)) + "' row " + row
            + " (row group " + g + "): decoded to " + (dst.position() - start) + " bytes, " + index.length(id)
            + " when indexed");
      }
    }
  }

  private VectorSchemaRoot decodeUnit(Long key, BufferAllocator into) throws IOException {
    return decode((int) (key >>> 32), (int) (long) key, columns, payload, into);
  }

  /** Reads row group {@code g} of a file (one ranged request for the chosen columns) and decodes it. */
  private VectorSchemaRoot decode(int fileNo, int g, List<String> names, List<ParquetColumns.Column> cols,
      BufferAllocator into) throws IOException {
    String file = files.get(fileNo);
    ParquetMetadata footer = footers.get(fileNo);
    BlockMetaData block = footer.getBlocks().get(g);
    MessageType projection = ParquetColumns.projection(footer.getFileMetaData().getSchema(), names);
    StorageInputFile in = new StorageInputFile(storage, file, sizes.get(fileNo));
    try (ParquetFileReader r = ParquetFileReader.open(in, footer, OPTIONS, in.newStream())) {
      r.setRequestedSchema(projection);
      PageReadStore pages = r.readRowGroup(g);
      return ParquetColumns.decode(pages, projection, cols, footer.getFileMetaData().getCreatedBy(), into);
    } catch (OutOfMemoryException e) {
      throw new DecodedUnits.NoRoom("dataset '" + dataset + "': row group " + g + " of Parquet file '"
          + storage.describe(file) + "' (" + block.getRowCount() + " rows, " + block.getTotalByteSize()
          + " bytes uncompressed) does not fit in"
          + " the memory for decoded row groups (" + into.getLimit() + " bytes, a quarter of what --memory-budget"
          + " leaves for batches): write smaller row groups or raise --memory-budget", e);
    } catch (IOException | RuntimeException e) {
      throw corrupt(file, sizes.get(fileNo), block.getStartingPos(), "row group " + g + " (" + block.getRowCount()
          + " rows at byte offset " + block.getStartingPos() + ", " + block.getCompressedSize() + " bytes)", e);
    }
  }

  /** The chosen columns' uncompressed size: about what the row group takes decoded. */
  private long decodedEstimate(BlockMetaData block) {
    long n = 0;
    for (ColumnChunkMetaData c : block.getColumns()) {
      if (columns.contains(c.getPath().toArray()[0])) {
        n += c.getTotalUncompressedSize();
      }
    }
    return n;
  }

  private CorruptRecordException corrupt(String file, long size, long offset, String where, Exception e) {
    CorruptRecordException c = new CorruptRecordException(storage.describe(file), offset, "dataset '" + dataset
        + "': corrupt or truncated Parquet file '" + storage.describe(file) + "' (" + size + " bytes): cannot read "
        + where + ": " + e.getMessage());
    c.initCause(e);
    return c;
  }

  /** What the Python decoder needs: the payload's Arrow schema; the index carries it as its layout. */
  private ObjectNode layout() {
    ObjectNode o = JsonNodeFactory.instance.objectNode();
    o.put("arrow_schema", Base64.getEncoder().encodeToString(schemaMessage(schema)));
    columns.forEach(o.putArray("columns")::add);
    if (label != null) {
      o.put("label", label);
    }
    return o;
  }

  @Override
  public void close() {
    rowMessages.close();
    if (units != null) {
      units.close();
    }
  }

  private static boolean isParquet(String path) {
    String name = path.substring(path.lastIndexOf('/') + 1);
    return name.endsWith(".parquet") && !name.startsWith(".") && !name.startsWith("_");
  }

  /**
   * One row of decoded vectors as an Arrow IPC record batch message (continuation, metadata, body), copied into a
   * reused one-row root first (a slice per row allocated a vector per column, several times the message's cost).
   * The root is reset before each copy, so a row's message has the same bytes however often, and after whichever
   * rows, it is built.
   */
  private final class RowMessages implements AutoCloseable {
    private final java.util.concurrent.ConcurrentLinkedQueue<VectorSchemaRoot> idle =
        new java.util.concurrent.ConcurrentLinkedQueue<>();

    int size(List<FieldVector> vectors, int row) throws IOException {
      RowChannel c = new RowChannel(null);
      write(vectors, row, c);
      return Math.toIntExact(c.count);
    }

    void write(List<FieldVector> vectors, int row, ByteBuffer dst) throws IOException {
      write(vectors, row, new RowChannel(dst));
    }

    private void write(List<FieldVector> vectors, int row, WritableByteChannel out) throws IOException {
      VectorSchemaRoot one = idle.poll();
      if (one == null) {
        one = VectorSchemaRoot.create(schema, units.memory());
      }
      try {
        for (int c = 0; c < vectors.size(); c++) {
          FieldVector to = one.getVector(c);
          to.reset(); // zeroes validity, offsets and values (and children's): nothing of the last row stays
          copyRow(vectors.get(c), row, to);
          to.setValueCount(1);
        }
        one.setRowCount(1);
        try (ArrowRecordBatch batch = new VectorUnloader(one).getRecordBatch()) {
          MessageSerializer.serialize(new WriteChannel(out), batch, IpcOption.DEFAULT);
        }
      } finally {
        idle.add(one);
      }
    }

    /**
     * Copies value {@code row} of {@code from} to value 0 of {@code to}. Threads copy from one decoded row group at
     * once, so nothing here may use state kept in {@code from}: Arrow's own {@code ListVector.copyFrom} positions
     * the source's one shared reader, hence the list case by hand (lists hold primitives: {@link ParquetColumns}).
     */
    private static void copyRow(FieldVector from, int row, FieldVector to) {
      if (!(from instanceof ListVector list)) {
        to.copyFromSafe(row, 0, from);
        return;
      }
      ListVector dst = (ListVector) to;
      if (list.isNull(row)) {
        dst.setNull(0);
        return;
      }
      int start = list.getOffsetBuffer().getInt(4L * row);
      int end = list.getOffsetBuffer().getInt(4L * (row + 1));
      dst.startNewValue(0);
      FieldVector items = (FieldVector) list.getDataVector();
      FieldVector out = (FieldVector) dst.getDataVector();
      for (int k = start; k < end; k++) {
        out.copyFromSafe(k, k - start, items);
      }
      dst.endValue(0, end - start);
    }

    @Override
    public void close() {
      idle.forEach(VectorSchemaRoot::close);
      idle.clear();
    }
  }

  static byte[] schemaMessage(Schema schema) {
    ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    try {
      MessageSerializer.serialize(new WriteChannel(Channels.newChannel(bytes)), schema, IpcOption.DEFAULT);
    } catch (IOException e) {
      throw new java.io.UncheckedIOException(e);
    }
    return bytes.toByteArray();
  }

  /** Where a row's message goes: into {@code dst}, or (null) only counted. */
  private static final class RowChannel implements WritableByteChannel {
    private final ByteBuffer dst;
    long count;

    RowChannel(ByteBuffer dst) {
      this.dst = dst;
    }

    @Override
    public int write(ByteBuffer src) throws IOException {
      int n = src.remaining();
      if (dst == null) {
        src.position(src.limit());
      } else if (n > dst.remaining()) {
        throw new IOException("a row's message is longer than indexed (" + dst.remaining() + " bytes left)");
      } else {
        dst.put(src);
      }
      count += n;
      return n;
    }

    @Override
    public boolean isOpen() {
      return true;
    }

    @Override
    public void close() {}
  }
}
