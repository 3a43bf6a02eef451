package io.unstall.flight.format;

import java.util.ArrayList;
import java.util.List;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.BaseVariableWidthVector;
import org.apache.arrow.vector.BitVector;
import org.apache.arrow.vector.BitVectorHelper;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.FixedWidthVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.complex.ListVector;
import org.apache.arrow.vector.types.DateUnit;
import org.apache.arrow.vector.types.FloatingPointPrecision;
import org.apache.arrow.vector.types.TimeUnit;
import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.FieldType;
import org.apache.arrow.vector.types.pojo.Schema;
import org.apache.parquet.column.ColumnDescriptor;
import org.apache.parquet.column.ColumnReader;
import org.apache.parquet.column.impl.ColumnReadStoreImpl;
import org.apache.parquet.column.page.PageReadStore;
import org.apache.parquet.example.data.simple.convert.GroupRecordConverter;
import org.apache.parquet.schema.GroupType;
import org.apache.parquet.schema.LogicalTypeAnnotation;
import org.apache.parquet.schema.MessageType;
import org.apache.parquet.schema.PrimitiveType;
import org.apache.parquet.schema.Type;

/**
 * The chosen columns of a Parquet schema as Arrow fields, and a row group of them decoded into Arrow vectors,
 * with parquet-java's column readers doing all of Parquet's decoding (pages, encodings, levels). Supported: the
 * flat types (booleans, integers of every width and sign, floats, strings, binary, fixed-size binary, dates,
 * timestamps) and lists of them; anything else is refused at registration naming the column and its type.
 */
final class ParquetColumns {
  /** One chosen top-level column: its Arrow field, its Parquet leaf, and the definition levels of a list. */
  record Column(Field field, ColumnDescriptor leaf, boolean list, int listDefined, int elementPresent) {}

  private ParquetColumns() {}

  /** The columns {@code names} of {@code schema}; errors name the file and column. */
  static List<Column> choose(MessageType schema, List<String> names, String file) {
    List<Column> out = new ArrayList<>();
    for (String name : names) {
      if (!schema.containsField(name)) {
        List<String> have = schema.getFields().stream().map(Type::getName).toList();
        throw new IllegalArgumentException(
            "Parquet file '" + file + "' has no column '" + name + "' (its columns: " + String.join(", ", have) + ")");
      }
      out.add(column(schema, schema.getType(name), file));
    }
    return out;
  }

  private static Column column(MessageType schema, Type t, String file) {
    if (t.isPrimitive() && !t.isRepetition(Type.Repetition.REPEATED)) {
      ColumnDescriptor leaf = schema.getColumnDescription(new String[] {t.getName()});
      return new Column(new Field(t.getName(), FieldType.nullable(arrowType(t.asPrimitiveType(), file)), null), leaf,
          false, 0, 0);
    }
    // The standard three-level LIST: <optional|required> group name (LIST) { repeated group list { element } }
    if (!t.isPrimitive() && t.getLogicalTypeAnnotation() instanceof LogicalTypeAnnotation.ListLogicalTypeAnnotation) {
      GroupType g = t.asGroupType();
      if (g.getFieldCount() == 1 && !g.getType(0).isPrimitive() && g.getType(0).isRepetition(Type.Repetition.REPEATED)
          && g.getType(0).asGroupType().getFieldCount() == 1 && g.getType(0).asGroupType().getType(0).isPrimitive()) {
        GroupType repeated = g.getType(0).asGroupType();
        PrimitiveType element = repeated.getType(0).asPrimitiveType();
        ColumnDescriptor leaf =
            schema.getColumnDescription(new String[] {t.getName(), repeated.getName(), element.getName()});
        int listDefined = t.isRepetition(Type.Repetition.OPTIONAL) ? 1 : 0;
        Field item = new Field(element.getName(), FieldType.nullable(arrowType(element, file)), null);
        return new Column(new Field(t.getName(), FieldType.nullable(ArrowType.List.INSTANCE), List.of(item)), leaf,
            true, listDefined, listDefined + 1);
      }
    }
    throw new IllegalArgumentException(
        "Parquet file '" + file + "': column '" + t.getName() + "' has the type " + t.toString().trim()
            + ", which the sidecar does not read (supported: booleans, integers, floats, strings, binary, dates,"
            + " timestamps, and lists of them)");
  }

  static ArrowType arrowType(PrimitiveType p, String file) {
    LogicalTypeAnnotation l = p.getLogicalTypeAnnotation();
    switch (p.getPrimitiveTypeName()) {
      case BOOLEAN:
        return ArrowType.Bool.INSTANCE;
      case INT32:
        if (l == null) {
          return new ArrowType.Int(32, true);
        }
        if (l instanceof LogicalTypeAnnotation.IntLogicalTypeAnnotation i) {
          return new ArrowType.Int(i.getBitWidth(), i.isSigned());
        }
        if (l instanceof LogicalTypeAnnotation.DateLogicalTypeAnnotation) {
          return new ArrowType.Date(DateUnit.DAY);
        }
        break;
      case INT64:
        if (l == null) {
          return new ArrowType.Int(64, true);
        }
        if (l instanceof LogicalTypeAnnotation.IntLogicalTypeAnnotation i) {
          return new ArrowType.Int(64, i.isSigned());
        }
        if (l instanceof LogicalTypeAnnotation.TimestampLogicalTypeAnnotation ts) {
          TimeUnit unit = switch (ts.getUnit()) {
            case MILLIS -> TimeUnit.MILLISECOND;
            case MICROS -> TimeUnit.MICROSECOND;
            case NANOS -> TimeUnit.NANOSECOND;
          };
          return new ArrowType.Timestamp(unit, ts.isAdjustedToUTC() ? "UTC" : null);
        }
        break;
      case FLOAT:
        return new ArrowType.FloatingPoint(FloatingPointPrecision.SINGLE);
      case DOUBLE:
        return new ArrowType.FloatingPoint(FloatingPointPrecision.DOUBLE);
      case BINARY:
        if (l == null) {
          return ArrowType.Binary.INSTANCE;
        }
        if (l instanceof LogicalTypeAnnotation.StringLogicalTypeAnnotation
            || l instanceof LogicalTypeAnnotation.EnumLogicalTypeAnnotation
            || l instanceof LogicalTypeAnnotation.JsonLogicalTypeAnnotation) {
          return ArrowType.Utf8.INSTANCE;
        }
        break;
      case FIXED_LEN_BYTE_ARRAY:
        if (l == null) {
          return new ArrowType.FixedSizeBinary(p.getTypeLength());
        }
        if (l instanceof LogicalTypeAnnotation.Float16LogicalTypeAnnotation) {
          return new ArrowType.FloatingPoint(FloatingPointPrecision.HALF);
        }
        break;
      default:
        break;
    }
    throw new IllegalArgumentException(
        "Parquet file '" + file + "': column '" + p.getName() + "' has the type " + p.toString().trim()
            + ", which the sidecar does not read (supported: booleans, integers, floats, strings, binary, dates,"
            + " timestamps, and lists of them)");
  }

  static Schema schema(List<Column> columns) {
    return new Schema(columns.stream().map(Column::field).toList());
  }

  /** Only {@code columns} of {@code schema}: what a row group read fetches. */
  static MessageType projection(MessageType schema, List<String> columns) {
    return new MessageType(schema.getName(), columns.stream().map(schema::getType).toList());
  }

  /** Decodes the columns of one row group ({@code pages}, read with {@code projection}) into {@code memory}. */
  static VectorSchemaRoot decode(PageReadStore pages, MessageType projection, List<Column> columns, String createdBy,
      BufferAllocator memory) {
    int rows = Math.toIntExact(pages.getRowCount());
    ColumnReadStoreImpl store =
        new ColumnReadStoreImpl(pages, new GroupRecordConverter(projection).getRootConverter(), projection, createdBy);
    List<FieldVector> vectors = new ArrayList<>();
    try {
      for (Column c : columns) {
        FieldVector v = c.field().createVector(memory);
        vectors.add(v);
        ColumnReader r = store.getColumnReader(c.leaf());
        if (c.list()) {
          fillList((ListVector) v, r, c, rows);
        } else {
          allocate(v, rows);
          for (int i = 0; i < rows; i++) {
            if (r.getCurrentDefinitionLevel() == c.leaf().getMaxDefinitionLevel()) {
              set(v, i, r);
            } else if (v instanceof BaseVariableWidthVector bv) {
              bv.setNull(i);
            }
            r.consume();
          }
          v.setValueCount(rows);
        }
      }
      VectorSchemaRoot root = new VectorSchemaRoot(vectors);
      root.setRowCount(rows);
      return root;
    } catch (RuntimeException e) {
      vectors.forEach(FieldVector::close);
      throw e;
    }
  }

  private static void fillList(ListVector lv, ColumnReader r, Column c, int rows) {
    FieldVector inner = (FieldVector) lv.addOrGetVector(c.field().getChildren().get(0).getFieldType()).getVector();
    lv.setInitialCapacity(rows);
    lv.allocateNew();
    allocate(inner, (int) Math.max(1, r.getTotalValueCount()));
    int max = c.leaf().getMaxDefinitionLevel();
    int row = -1;
    int count = 0;
    int elem = 0;
    boolean open = false;
    for (long k = r.getTotalValueCount(); k > 0; k--) {
      int dl = r.getCurrentDefinitionLevel();
      if (r.getCurrentRepetitionLevel() == 0) {
        if (open) {
          lv.endValue(row, count);
        }
        row++;
        count = 0;
        open = dl >= c.listDefined();
        if (open) {
          lv.startNewValue(row);
        } else {
          lv.setNull(row);
        }
      }
      if (dl >= c.elementPresent()) {
        if (dl == max) {
          set(inner, elem, r);
        } else if (inner instanceof BaseVariableWidthVector bv) {
          bv.setNull(elem);
        }
        elem++;
        count++;
      }
      r.consume();
    }
    if (open) {
      lv.endValue(row, count);
    }
    if (row + 1 != rows) {
      throw new IllegalStateException("column '" + c.field().getName() + "' has " + (row + 1) + " rows, the row group "
          + rows);
    }
    inner.setValueCount(elem);
    lv.setValueCount(rows);
  }

  private static void allocate(FieldVector v, int n) {
    if (v instanceof FixedWidthVector f) {
      f.allocateNew(n);
      v.getDataBuffer().setZero(0, v.getDataBuffer().capacity()); // null slots serialize as zeros
    } else {
      v.setInitialCapacity(n);
      v.allocateNew();
    }
  }

  /** Writes the reader's current value at {@code i} of {@code v} (whose type {@link #arrowType} chose). */
  private static void set(FieldVector v, int i, ColumnReader r) {
    if (v instanceof BitVector b) {
      b.set(i, r.getBoolean() ? 1 : 0);
      return;
    }
    if (v instanceof BaseVariableWidthVector bv) {
      bv.setSafe(i, r.getBinary().getBytes());
      return;
    }
    ArrowBuf data = v.getDataBuffer();
    ArrowType t = v.getField().getType();
    if (t instanceof ArrowType.Int it) {
      switch (it.getBitWidth()) {
        case 8 -> data.setByte(i, r.getInteger());
        case 16 -> data.setShort(2L * i, (short) r.getInteger());
        case 32 -> data.setInt(4L * i, r.getInteger());
        default -> data.setLong(8L * i, r.getLong());
      }
    } else if (t instanceof ArrowType.Date) {
      data.setInt(4L * i, r.getInteger());
    } else if (t instanceof ArrowType.Timestamp) {
      data.setLong(8L * i, r.getLong());
    } else if (t instanceof ArrowType.FloatingPoint fp && fp.getPrecision() == FloatingPointPrecision.SINGLE) {
      data.setFloat(4L * i, r.getFloat());
    } else if (t instanceof ArrowType.FloatingPoint fp && fp.getPrecision() == FloatingPointPrecision.DOUBLE) {
      data.setDouble(8L * i, r.getDouble());
    } else { // HALF floats and fixed-size binary: the stored bytes (Parquet's FLOAT16 is little-endian, as Arrow's)
      byte[] b = r.getBinary().getBytes();
      data.setBytes((long) b.length * i, b);
    }
    BitVectorHelper.setBit(v.getValidityBuffer(), i);
  }
}
