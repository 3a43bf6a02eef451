package io.unstall.flight.prep;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.bytedeco.opencv.global.opencv_core;
import org.junit.jupiter.api.Test;

/**
 * OpenCV without OpenBLAS: in a JVM that binds every symbol at load time (LD_BIND_NOW), so a function OpenCV
 * imports that the stub libopenblas.so.0 lacked would fail the load, opencv_core initialises and the only
 * libopenblas.so.0 in the process is the stub.
 */
class OpenCvTest {
  /** Runs in the forked JVM: loads OpenCV, prints the libopenblas files mapped. */
  public static final class Probe {
    public static void main(String[] args) throws IOException {
      OpenCv.load();
      opencv_core.setNumThreads(0);
      Files.readAllLines(Path.of("/proc/self/maps")).stream().filter(l -> l.contains("libopenblas"))
          .map(l -> l.substring(l.indexOf('/'))).distinct().forEach(System.out::println);
    }
  }

  @Test
  void opencvLoadsWithEverySymbolBoundAndOnlyTheStubBlas() throws Exception {
    Path java = Path.of(System.getProperty("java.home"), "bin", "java");
    ProcessBuilder pb = new ProcessBuilder(java.toString(), "-cp", System.getProperty("java.class.path"),
        Probe.class.getName()).redirectErrorStream(true);
    pb.environment().put("LD_BIND_NOW", "1");
    Process p = pb.start();
    assertTrue(p.waitFor(120, TimeUnit.SECONDS), "the probe JVM did not exit");
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    assertEquals(0, p.exitValue(), out);
    List<String> mapped = out.lines().filter(l -> l.startsWith("/")).toList();
    assertFalse(mapped.isEmpty(), "no libopenblas.so.0 mapped: " + out);
    byte[] stub;
    try (InputStream in = OpenCv.class.getResourceAsStream(OpenCv.NO_BLAS)) {
      stub = in.readAllBytes();
    }
    for (String path : mapped) {
      // JavaCPP's cache names the copy after where it came from (a jar, or a classes directory).
      assertArrayEquals(stub, Files.readAllBytes(Path.of(path)),
          "a libopenblas other than the stub is mapped: " + path);
    }
  }
}
