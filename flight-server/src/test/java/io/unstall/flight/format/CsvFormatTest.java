package io.unstall.flight.format;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.ObjectMapper;
import io.unstall.flight.storage.LocalStorage;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class CsvFormatTest {
  @TempDir Path dir;

  private static Format format(String json) throws Exception {
    return Formats.create("csv", FormatOptions.of("csv", new ObjectMapper().readTree(json)));
  }

  private static List<String> rows(Format f, LocalStorage s, SampleIndex idx) throws Exception {
    List<String> out = new ArrayList<>();
    for (int i = 0; i < idx.size(); i++) {
      ByteBuffer b = ByteBuffer.allocate(idx.length(i));
      f.read(s, idx, i, b);
      out.add(new String(b.array(), StandardCharsets.UTF_8));
    }
    return out;
  }

  @Test
  void rowsFollowRfc4180QuotingAndTypesAreInferredOverTheFile() throws Exception {
    String csv = "id,name,score,ok,note\r\n"
        + "1,\"Smith, J\",1.5,true,\r\n"
        + "\r\n" // an empty line: skipped
        + "2,\"say \"\"hi\"\"\",2,false,\"two\nlines\"\r\n"
        + "-3,x,NaN,1,NA";
    Files.writeString(dir.resolve("a.csv"), csv);
    Format f = format("{\"label\": \"ok\"}");
    LocalStorage s = new LocalStorage(dir);
    SampleIndex idx = f.index(s, n -> {});
    assertEquals(List.of("1,\"Smith, J\",1.5,true,", "2,\"say \"\"hi\"\"\",2,false,\"two\nlines\"", "-3,x,NaN,1,NA"),
        rows(f, s, idx));
    assertEquals("{\"columns\":[\"id\",\"name\",\"score\",\"ok\",\"note\"],"
        + "\"types\":{\"id\":\"int64\",\"name\":\"string\",\"score\":\"double\",\"ok\":\"bool\","
        + "\"note\":\"string\"},\"delimiter\":\",\",\"label\":\"ok\"}", idx.layout());
    assertEquals("a.csv@" + "id,name,score,ok,note\r\n".length(), f.key(idx, 0));
  }

  @Test
  void headerlessFilesAndDeclaredTypes() throws Exception {
    Files.writeString(dir.resolve("b.csv"), "1;x\n2;y\n");
    SampleIndex idx = format("{\"header\": false, \"delimiter\": \";\", \"types\": {\"f0\": \"string\"}}")
        .index(new LocalStorage(dir), n -> {});
    assertEquals(2, idx.size());
    assertTrue(idx.layout().contains("\"types\":{\"f0\":\"string\",\"f1\":\"string\"}"), idx.layout());
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> format("{\"label\": \"nope\"}").index(new LocalStorage(dir), n -> {}));
    assertTrue(e.getMessage().startsWith("format 'csv': option 'label' names the column 'nope'"), e.getMessage());
  }

  @Test
  void badRowsNameFileOffsetAndLine() throws Exception {
    Path p = dir.resolve("c.csv");
    Files.writeString(p, "a,b\n1,2\n3\n");
    CorruptRecordException fields = assertThrows(CorruptRecordException.class,
        () -> format("{}").index(new LocalStorage(p), n -> {}));
    assertEquals("corrupt CSV file '" + p + "' at byte offset 8 (line 3): a row of 1 fields where the header has 2",
        fields.getMessage());
    Files.writeString(p, "a,b\n1,2\n3,\"open\n");
    CorruptRecordException open = assertThrows(CorruptRecordException.class,
        () -> format("{}").index(new LocalStorage(p), n -> {}));
    assertEquals("corrupt CSV file '" + p + "' at byte offset 8 (line 3): unterminated quoted field (the file ends"
        + " inside it)", open.getMessage());
  }

  @Test
  void inference() {
    assertEquals("int64", infer("1", "-20", ""));
    assertEquals("bool", infer("1", "0", "true"));
    assertEquals("double", infer("1", "2.5e3", "null"));
    assertEquals("string", infer("1", "2", "true"));
    assertEquals("null", infer("", "NA"));
  }

  private static String infer(String... values) {
    SampleIndex.Builder unused = new SampleIndex.Builder(false);
    int can = 7;
    for (String v : values) {
      can = CsvFormat.observe(can, v);
    }
    return (can & 8) == 0 ? "null" : (can & 1) != 0 ? "int64" : (can & 2) != 0 ? "bool" : (can & 4) != 0 ? "double"
        : "string";
  }
}
