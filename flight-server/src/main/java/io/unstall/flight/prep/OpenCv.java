package io.unstall.flight.prep;

import java.io.File;
import java.io.IOException;
import org.bytedeco.javacpp.Loader;

/**
 * Makes bytedeco's OpenCV load without OpenBLAS. libopencv_core.so.413 is linked against libopenblas.so.0 for its
 * matrix algebra, which prep never calls, and JavaCPP's OpenCV presets inherit the OpenBLAS presets, which load
 * OpenBLAS's JNI library when opencv_core initialises; OpenBLAS's natives would be most of the sidecar jar. So
 * the jar carries a stub libopenblas.so.0 instead (src/main/c/noblas), loaded here first: the dynamic linker
 * then resolves OpenCV's dependency to it by its soname. {@code org.bytedeco.openblas.load=none} is JavaCPP's
 * own switch that keeps its presets from loading any BLAS.
 */
public final class OpenCv {
  static final String NO_BLAS = "/native/linux-x86_64/libopenblas.so.0";
  static final String OPENBLAS_LOAD = "org.bytedeco.openblas.load";

  static {
    System.setProperty(OPENBLAS_LOAD, "none");
    File stub;
    try {
      stub = Loader.cacheResource(OpenCv.class, NO_BLAS);
    } catch (IOException e) {
      throw new IllegalStateException("extracting " + NO_BLAS + " for OpenCV failed: " + e.getMessage(), e);
    }
    if (stub == null) {
      throw new IllegalStateException("the jar has no " + NO_BLAS + " (flight-server/src/main/c/noblas/build.sh"
          + " builds it), so OpenCV cannot load");
    }
    System.load(stub.getAbsolutePath());
  }

  private OpenCv() {}

  /** Call before the first use of an {@code org.bytedeco.opencv} class; the work is done once. */
  public static void load() {
    // The static initializer above runs on the first call, once, whichever thread makes it.
  }
}
