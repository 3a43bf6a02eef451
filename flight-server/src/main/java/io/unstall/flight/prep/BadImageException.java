package io.unstall.flight.prep;

/**
 * A sample a pipeline will not decode: a format it does not accept, a header that is malformed or cut short,
 * a size beyond its caps or the decode memory, or bytes the decoder rejects. The message says which, without
 * naming the sample (the caller does). A leaf, so that {@link ImageHeader} needs none of the prep classes.
 */
public final class BadImageException extends java.io.IOException {
  public BadImageException(String message) {
    super(message);
  }
}
