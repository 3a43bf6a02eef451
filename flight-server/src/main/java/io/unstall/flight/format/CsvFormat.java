package io.unstall.flight.format;

import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.storage.Storage;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.function.LongConsumer;

/**
 * CSV files, a sample per row: the root, or every {@code .csv} file of a directory in path order. Indexing scans
 * each file once (RFC 4180: fields in double quotes may hold delimiters, doubled quotes and line breaks; lines end
 * in LF, CRLF or CR; empty lines are skipped, as Arrow's CSV reader skips them) and records each row's byte range,
 * without its line break; a row's field count must match the header's. It also infers each column's type over the
 * whole file, in Arrow's order of preference: {@code int64}, {@code bool}, {@code double}, else {@code string}
 * ({@code null} when every value is null; Arrow's default null and true/false spellings), so that every batch is
 * decoded with the same types; option {@code types} declares some ({@code {"when": "timestamp[s]"}}), any Arrow type
 * name. The client parses a batch's rows with Arrow's CSV reader under these names and types. Options: {@code
 * delimiter} (one character, {@code ,}), {@code header} (true: the first row names the columns; false: named {@code
 * columns}, else {@code f0, f1, ...}), {@code label} (a column the client yields as the target).
 */
public final class CsvFormat implements ContentIndexed {
  /** pyarrow.csv.ConvertOptions' default null_values, true_values and false_values. */
  static final Set<String> NULLS = Set.of("", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan",
      "1.#IND", "1.#QNAN", "N/A", "NA", "NULL", "NaN", "n/a", "nan", "null");
  static final Set<String> BOOLS = Set.of("1", "True", "TRUE", "true", "0", "False", "FALSE", "false");
  private static final int CAN_INT = 1;
  private static final int CAN_BOOL = 2;
  private static final int CAN_DOUBLE = 4;
  private static final int SEEN = 8;
  private static final int BLOCK = 4 << 20;

  private final byte delimiter;
  private final boolean header;
  private final List<String> columns;
  private final String label;
  private final Map<String, String> types;

  public CsvFormat(FormatOptions options) {
    options.allow("delimiter", "header", "columns", "label", "types");
    String d = options.string("delimiter", ",");
    if (d.length() != 1 || d.charAt(0) > 127 || d.charAt(0) == '"' || d.charAt(0) == '\n' || d.charAt(0) == '\r') {
      throw options.problem(
          "delimiter", "must be one ASCII character other than a quote or line break, got '" + d + "'");
    }
    this.delimiter = (byte) d.charAt(0);
    this.header = options.bool("header", true);
    this.columns = options.strings("columns");
    if (header && !columns.isEmpty()) {
      throw options.problem("columns", "names the columns of a file without a header row; set header to false");
    }
    this.label = options.string("label", null);
    this.types = options.stringMap("types");
  }

  @Override
  public String name() {
    return "csv";
  }

  @Override
  public SampleIndex index(Storage storage, LongConsumer progress) throws IOException {
    List<String> files = ContentIndexed.files(storage, ".csv", null);
    SampleIndex.Builder b = new SampleIndex.Builder(false);
    Scan scan = new Scan(progress);
    for (String f : files) {
      scan.file(storage, f, b.file(f), b);
    }
    List<String> names = scan.names;
    if (label != null && !names.contains(label)) {
      throw new IllegalArgumentException("format 'csv': option 'label' names the column '" + label + "', which is not"
          + " one of " + names);
    }
    for (String c : types.keySet()) {
      if (!names.contains(c)) {
        throw new IllegalArgumentException("format 'csv': option 'types' names the column '" + c + "', which is not"
            + " one of " + names);
      }
    }
    ObjectNode layout = JsonNodeFactory.instance.objectNode();
    names.forEach(layout.putArray("columns")::add);
    ObjectNode t = layout.putObject("types");
    for (int i = 0; i < names.size(); i++) {
      t.put(names.get(i), types.getOrDefault(names.get(i), inferred(scan.can[i])));
    }
    layout.put("delimiter", String.valueOf((char) delimiter));
    if (label == null) {
      layout.putNull("label");
    } else {
      layout.put("label", label);
    }
    return b.layout(layout.toString()).build();
  }

  private static String inferred(int can) {
    if ((can & SEEN) == 0) {
      return "null";
    }
    return (can & CAN_INT) != 0 ? "int64" : (can & CAN_BOOL) != 0 ? "bool" : (can & CAN_DOUBLE) != 0 ? "double"
        : "string";
  }


  /** The scan of a dataset's files: column names, what each column's values can be, rows. */
  private final class Scan {
    final LongConsumer progress;
    List<String> names;
    int[] can;
    long rows;
    private final List<String> row = new ArrayList<>();
    private final StringBuilder field = new StringBuilder();

    Scan(LongConsumer progress) {
      this.progress = progress;
    }

    void file(Storage storage, String f, int fileNo, SampleIndex.Builder b) throws IOException {
      long size = storage.pin(f);
      StorageChannel ch = new StorageChannel(storage, f, size, BLOCK);
      ByteBuffer buf = ByteBuffer.allocate((int) Math.min(BLOCK, Math.max(1, size)));
      boolean first = true;
      long rowStart = 0;
      long line = 1;
      long rowLine = 1;
      boolean quoted = false; // inside a quoted field
      boolean fieldStart = true;
      boolean afterQuote = false; // just read a quote inside a quoted field: the closing one, or half of ""
      byte prev = 0;
      long pos = 0;
      row.clear();
      field.setLength(0);
      java.io.ByteArrayOutputStream bytes = new java.io.ByteArrayOutputStream();
      while (pos <= size) {
        int c;
        if (pos == size) {
          c = -1;
        } else {
          if (!buf.hasRemaining() || pos == 0) {
            buf.clear().limit((int) Math.min(buf.capacity(), size - pos));
            ch.readFully(pos, buf);
            buf.flip();
          }
          c = buf.get() & 0xff;
        }
        if (quoted) {
          if (c == -1 && !afterQuote) {
            throw corrupt(storage, f, rowStart, rowLine, "unterminated quoted field (the file ends inside it)");
          }
          if (afterQuote) {
            afterQuote = false;
            if (c == '"') {
              bytes.write('"');
              prev = (byte) c;
              pos++;
              continue;
            }
            quoted = false; // that was the closing quote: c is handled below
          } else {
            if (c == '"') {
              afterQuote = true;
            } else {
              bytes.write(c);
              if (c == '\n' || (c == '\r')) {
                line += c == '\n' && prev == '\r' ? 0 : 1;
              }
            }
            prev = (byte) c;
            pos++;
            continue;
          }
        }
        if (c == '"' && fieldStart) {
          quoted = true;
          fieldStart = false;
        } else if (c == delimiter) {
          endField(bytes);
          fieldStart = true;
        } else if (c == '\n' || c == '\r' || c == -1) {
          boolean crlfTail = c == '\n' && prev == '\r';
          long end = pos;
          if (!crlfTail) {
            boolean empty = end == rowStart && row.isEmpty();
            if (!empty) {
              endField(bytes);
              first = endRow(storage, f, fileNo, b, rowStart, end, rowLine, first);
            }
            line++;
          }
          rowStart = pos + 1;
          rowLine = line;
          fieldStart = true;
        } else {
          bytes.write(c);
          fieldStart = false;
        }
        prev = (byte) c;
        pos++;
      }
      if (first && header) {
        throw corrupt(storage, f, 0, 1, "no header row: the file is empty");
      }
    }

    private void endField(java.io.ByteArrayOutputStream bytes) {
      row.add(bytes.toString(StandardCharsets.UTF_8));
      bytes.reset();
    }

    /** Ends a row of {@link #row}'s fields at [start, end); returns whether the next row is still the file's first. */
    private boolean endRow(Storage storage, String f, int fileNo, SampleIndex.Builder b, long start, long end,
        long line, boolean first) throws IOException {
      List<String> fields = new ArrayList<>(row);
      row.clear();
      if (first) {
        List<String> these = header ? fields : names(fields.size());
        if (names == null) {
          Set<String> unique = new HashSet<>(these);
          if (unique.size() != these.size()) {
            throw corrupt(storage, f, start, line, "the header names a column twice: " + these);
          }
          names = these;
          can = new int[names.size()];
          java.util.Arrays.fill(can, CAN_INT | CAN_BOOL | CAN_DOUBLE);
        } else if (!names.equals(these)) {
          throw corrupt(storage, f, start, line, "its columns " + these + " differ from the first file's " + names);
        }
        if (header) {
          return false;
        }
      }
      if (fields.size() != names.size()) {
        throw corrupt(storage, f, start, line, "a row of " + fields.size() + " fields where the header has "
            + names.size());
      }
      for (int i = 0; i < fields.size(); i++) {
        can[i] = observe(can[i], fields.get(i));
      }
      b.add(fileNo, start, end - start, -1);
      progress.accept(++rows);
      return false;
    }

    private List<String> names(int n) {
      if (!columns.isEmpty()) {
        if (columns.size() != n) {
          throw new IllegalArgumentException("format 'csv': option 'columns' names " + columns.size()
              + " columns but the rows have " + n + " fields");
        }
        return columns;
      }
      List<String> out = new ArrayList<>();
      for (int i = 0; i < n; i++) {
        out.add("f" + i);
      }
      return out;
    }
  }

  /** What a column whose values could be {@code can} can be after also holding {@code v}. */
  static int observe(int can, String v) {
    if (NULLS.contains(v)) {
      return can;
    }
    can |= SEEN;
    if ((can & CAN_INT) != 0 && !isInt(v)) {
      can &= ~CAN_INT;
    }
    if ((can & CAN_BOOL) != 0 && !BOOLS.contains(v)) {
      can &= ~CAN_BOOL;
    }
    if ((can & CAN_DOUBLE) != 0 && !isDouble(v)) {
      can &= ~CAN_DOUBLE;
    }
    return can;
  }

  private static boolean isInt(String v) {
    int i = v.startsWith("-") ? 1 : 0;
    if (v.length() == i || v.length() - i > 19) {
      return false;
    }
    for (int k = i; k < v.length(); k++) {
      if (v.charAt(k) < '0' || v.charAt(k) > '9') {
        return false;
      }
    }
    try {
      Long.parseLong(v);
      return true;
    } catch (NumberFormatException e) {
      return false;
    }
  }

  private static boolean isDouble(String v) {
    return v.matches("-?(\\d+\\.?\\d*|\\.\\d+)([eE][-+]?\\d+)?");
  }

  private static CorruptRecordException corrupt(Storage storage, String f, long offset, long line, String what) {
    return new CorruptRecordException(storage.describe(f), offset, "corrupt CSV file '" + storage.describe(f)
        + "' at byte offset " + offset + " (line " + line + "): " + what);
  }
}
