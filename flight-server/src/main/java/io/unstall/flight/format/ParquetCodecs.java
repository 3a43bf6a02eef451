package io.unstall.flight.format;

import java.io.IOException;
import java.nio.ByteBuffer;
import org.apache.parquet.bytes.BytesInput;
import org.apache.parquet.compression.CompressionCodecFactory;
import org.apache.parquet.hadoop.metadata.CompressionCodecName;

/**
 * Parquet's page codecs without Hadoop: the libraries parquet-java itself depends on (snappy-java, zstd-jni,
 * aircompressor for LZ4_RAW) and the JDK's zlib for GZIP. BROTLI, LZO and Hadoop-framed LZ4 are refused, naming
 * the codec. Decompression only: the sidecar never writes Parquet.
 */
final class ParquetCodecs implements CompressionCodecFactory {
  static final ParquetCodecs INSTANCE = new ParquetCodecs();
  /** Pages are about a MiB; a header claiming more than this is corrupt (and must not make us allocate it). */
  static final int MAX_PAGE = 1 << 30;

  private ParquetCodecs() {}

  @Override
  public BytesInputCompressor getCompressor(CompressionCodecName codec) {
    throw new UnsupportedOperationException("the sidecar reads Parquet, it never writes it");
  }

  @Override
  public BytesInputDecompressor getDecompressor(CompressionCodecName codec) {
    return new BytesInputDecompressor() {
      @Override
      public BytesInput decompress(BytesInput in, int size) throws IOException {
        if (codec == CompressionCodecName.UNCOMPRESSED) {
          return in;
        }
        if (size < 0 || size > MAX_PAGE) {
          throw new IOException("a " + codec + " page header claims " + size + " bytes uncompressed (at most "
              + MAX_PAGE + ")");
        }
        byte[] src = in.toByteArray();
        byte[] out = new byte[size];
        int n;
        switch (codec) {
          case SNAPPY -> n = org.xerial.snappy.Snappy.uncompress(src, 0, src.length, out, 0);
          case ZSTD -> {
            long r = com.github.luben.zstd.Zstd.decompressByteArray(out, 0, size, src, 0, src.length);
            if (com.github.luben.zstd.Zstd.isError(r)) {
              throw new IOException("ZSTD: " + com.github.luben.zstd.Zstd.getErrorName(r));
            }
            n = (int) r;
          }
          case GZIP -> {
            try (var gz = new java.util.zip.GZIPInputStream(new java.io.ByteArrayInputStream(src))) {
              n = gz.readNBytes(out, 0, size);
            }
          }
          case LZ4_RAW ->
              n = new io.airlift.compress.lz4.Lz4Decompressor().decompress(src, 0, src.length, out, 0, size);
          default -> throw new IOException("the Parquet codec " + codec + " is not supported (supported: UNCOMPRESSED,"
              + " SNAPPY, GZIP, ZSTD, LZ4_RAW)");
        }
        if (n != size) {
          throw new IOException(codec + " page decompressed to " + n + " bytes, its header says " + size);
        }
        return BytesInput.from(out);
      }

      @Override
      public void decompress(ByteBuffer in, int compressedSize, ByteBuffer out, int size) throws IOException {
        byte[] src = new byte[compressedSize];
        in.duplicate().get(src);
        out.put(decompress(BytesInput.from(src), size).toByteBuffer());
      }

      @Override
      public void release() {}
    };
  }

  @Override
  public void release() {}
}
