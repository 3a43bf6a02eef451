package io.unstall.sidecar;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

class SizesTest {
  @Test
  void parsesBinaryDecimalAndBareSizes() {
    assertEquals(1048576, Sizes.parse("1048576"));
    assertEquals(512L << 20, Sizes.parse("512MiB"));
    assertEquals(2L << 30, Sizes.parse("2G"));
    assertEquals(2L << 30, Sizes.parse("2gib"));
    assertEquals(100_000_000L, Sizes.parse("100MB"));
    assertEquals(1536, Sizes.parse("1.5KiB"));
    assertEquals(0, Sizes.parse("0"));
  }

  @Test
  void rejectsNonSizesWithExamples() {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Sizes.parse("12XB"));
    assertTrue(e.getMessage().startsWith("'12XB' is not a size (examples:"), e.getMessage());
    assertThrows(IllegalArgumentException.class, () -> Sizes.parse("-1"));
  }

  @Test
  void formatsForPeople() {
    assertEquals("1.5 GiB", Sizes.format(3L << 29));
    assertEquals("999 B", Sizes.format(999));
  }
}
