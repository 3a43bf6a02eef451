package io.unstall.flight.prep;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The JNI library in the jar (the resource NativeJpeg loads) depends on glibc alone, at versions that old
 * userlands have, and exports only its JNI entry points: so it loads on Debian and Ubuntu alike and its
 * statically linked libjpeg-turbo never clashes with another libjpeg in the process. Reads the ELF itself.
 */
class NativeJpegLinkageTest {
  /** glibc's own libraries; libpthread and libdl are separate files before glibc 2.34. */
  static final Set<String> GLIBC = Set.of("libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2",
      "ld-linux-x86-64.so.2");
  /** The newest glibc symbol version allowed: glibc 2.17, older than Ubuntu 20.04's and Debian 11's 2.31. */
  static final int[] MAX_GLIBC = {2, 17};
  static final Pattern GLIBC_VERSION = Pattern.compile("GLIBC_(\\d+)\\.(\\d+)(?:\\.(\\d+))?");

  static Elf elf;

  @BeforeAll
  static void read() throws IOException {
    try (InputStream in = NativeJpeg.class.getResourceAsStream(NativeJpeg.RESOURCE)) {
      assumeTrue(in != null, "the build made no " + NativeJpeg.RESOURCE + " (see build.sh's line in its log)");
      elf = new Elf(ByteBuffer.wrap(in.readAllBytes()).order(ByteOrder.LITTLE_ENDIAN));
    }
  }

  @Test
  void needsNothingButGlibc() {
    assertTrue(elf.needed.contains("libc.so.6"), "no DT_NEEDED libc.so.6 in " + elf.needed);
    Set<String> others = new TreeSet<>(elf.needed);
    others.removeAll(GLIBC);
    assertTrue(others.isEmpty(), NativeJpeg.RESOURCE + " needs " + others + " beyond glibc (DT_NEEDED " + elf.needed
        + "): link it statically in src/main/c/build.sh");
  }

  @Test
  void glibcVersionsAreOldEnough() {
    assertTrue(!elf.versions.isEmpty(), "no symbol versions read from " + NativeJpeg.RESOURCE);
    List<String> tooNew = new ArrayList<>();
    for (String v : elf.versions) {
      Matcher m = GLIBC_VERSION.matcher(v);
      if (!m.matches()) {
        tooNew.add(v + " (not a GLIBC_x.y version)");
      } else if (compare(Integer.parseInt(m.group(1)), Integer.parseInt(m.group(2))) > 0) {
        tooNew.add(v);
      }
    }
    assertEquals(List.of(), tooNew, NativeJpeg.RESOURCE + " needs symbol versions other than GLIBC_x.y <= GLIBC_"
        + MAX_GLIBC[0] + "." + MAX_GLIBC[1] + " (all: " + elf.versions + "); objdump -T shows which symbols");
  }

  @Test
  void exportsOnlyItsJniEntryPoints() {
    List<String> foreign = new ArrayList<>();
    for (String s : elf.exported) {
      if (!s.startsWith("Java_io_unstall_") && !s.equals("JNI_OnLoad")) {
        foreign.add(s);
      }
    }
    assertTrue(elf.exported.contains("JNI_OnLoad"), "JNI_OnLoad not exported: " + elf.exported);
    assertEquals(List.of(), foreign, NativeJpeg.RESOURCE + " exports more than its JNI functions (libjpeg's symbols"
        + " must stay hidden: -Wl,--exclude-libs,ALL)");
  }

  static int compare(int major, int minor) {
    return major != MAX_GLIBC[0] ? Integer.compare(major, MAX_GLIBC[0]) : Integer.compare(minor, MAX_GLIBC[1]);
  }

  /** What a 64-bit little-endian ELF shared object's section headers say about its dynamic linking. */
  static final class Elf {
    static final int SHT_DYNSYM = 11;
    static final int SHT_DYNAMIC = 6;
    static final int SHT_GNU_VERNEED = 0x6ffffffe;
    static final long DT_NEEDED = 1;

    final List<String> needed = new ArrayList<>();
    /** The symbol versions it requires (Vernaux names), e.g. GLIBC_2.14. */
    final Set<String> versions = new TreeSet<>();
    /** Its defined global and weak dynamic symbols. */
    final Set<String> exported = new TreeSet<>();
    private final ByteBuffer b;

    Elf(ByteBuffer b) {
      this.b = b;
      assertTrue(b.getInt(0) == 0x464c457f && b.get(4) == 2 && b.get(5) == 1,
          NativeJpeg.RESOURCE + " is not a 64-bit little-endian ELF");
      long shoff = b.getLong(0x28);
      int shentsize = Short.toUnsignedInt(b.getShort(0x3A));
      int shnum = Short.toUnsignedInt(b.getShort(0x3C));
      for (int i = 0; i < shnum; i++) {
        int sh = (int) (shoff + (long) i * shentsize);
        int type = b.getInt(sh + 4);
        int off = (int) b.getLong(sh + 0x18);
        int size = (int) b.getLong(sh + 0x20);
        int strtab = (int) b.getLong((int) (shoff + (long) b.getInt(sh + 0x28) * shentsize) + 0x18);
        if (type == SHT_DYNAMIC) {
          for (int e = off; e + 16 <= off + size; e += 16) {
            if (b.getLong(e) == DT_NEEDED) {
              needed.add(string(strtab + (int) b.getLong(e + 8)));
            }
          }
        } else if (type == SHT_GNU_VERNEED) {
          int vn = off;
          for (int n = b.getInt(sh + 0x2C); n > 0; n--) { // sh_info: the number of Verneed entries
            int aux = vn + b.getInt(vn + 8);
            for (int a = Short.toUnsignedInt(b.getShort(vn + 2)); a > 0; a--) {
              versions.add(string(strtab + b.getInt(aux + 8)));
              aux += b.getInt(aux + 12);
            }
            vn += b.getInt(vn + 12);
          }
        } else if (type == SHT_DYNSYM) {
          for (int s = off; s + 24 <= off + size; s += 24) {
            int bind = (b.get(s + 4) & 0xff) >>> 4;
            boolean defined = b.getShort(s + 6) != 0;
            if (defined && (bind == 1 || bind == 2)) {
              exported.add(string(strtab + b.getInt(s)));
            }
          }
        }
      }
    }

    private String string(int at) {
      int end = at;
      while (b.get(end) != 0) {
        end++;
      }
      return new String(b.array(), at, end - at, StandardCharsets.US_ASCII);
    }
  }
}
