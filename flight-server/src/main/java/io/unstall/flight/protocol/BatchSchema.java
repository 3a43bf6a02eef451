package io.unstall.flight.protocol;

import java.util.List;
import java.util.Map;
import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.FieldType;
import org.apache.arrow.vector.types.pojo.Schema;

/** The record-batch schema of a fetched batch, wire version 1 (protocol/README.md). */
public final class BatchSchema {
  public static final String VERSION_KEY = "unstall.schema";
  public static final String VERSION = "1";
  public static final String ID = "id";
  public static final String LABEL = "label";
  public static final String KEY = "key";
  public static final String PAYLOAD = "payload";

  public static final Schema SCHEMA =
      new Schema(
          List.of(
              new Field(ID, FieldType.notNullable(new ArrowType.Int(64, true)), null),
              new Field(LABEL, FieldType.nullable(new ArrowType.Int(64, true)), null),
              new Field(KEY, FieldType.notNullable(ArrowType.Utf8.INSTANCE), null),
              new Field(PAYLOAD, FieldType.notNullable(ArrowType.Binary.INSTANCE), null)),
          Map.of(VERSION_KEY, VERSION));

  private BatchSchema() {}
}
