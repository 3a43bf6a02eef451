package io.unstall.flight.prep;

import io.airlift.compress.lz4.Lz4Compressor;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import org.apache.arrow.compression.Lz4CompressionCodec;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.compression.AbstractCompressionCodec;
import org.apache.arrow.vector.compression.CompressionUtil;
import org.apache.commons.compress.compressors.lz4.XXHash32;

/**
 * Arrow IPC's {@code LZ4_FRAME} body compression with aircompressor's LZ4 block compressor (already here through
 * Parquet), framed by hand: arrow-compression's own codec runs commons-compress's pure-Java LZ4, too slow for the
 * data path (benchmarks/results/2026-11-26-prep-fifth-pass.md).
 *
 * <p>The frame is the LZ4 frame format's simplest: magic, a descriptor with independent blocks of at most 4 MiB,
 * no checksums and no content size, then each block (stored as is when LZ4 does not shrink it), then the end mark.
 * Any LZ4 frame reader takes it (pyarrow, {@code lz4 -d}, commons-compress). Decompression, which the sidecar never
 * does on the data path, stays arrow-compression's (it reads every frame variant). A new instance per use: the block
 * compressor keeps a hash table, so it is not thread-safe.
 */
final class Lz4FrameCodec extends AbstractCompressionCodec {
  private static final int MAGIC = 0x184D2204;
  private static final byte FLG = 0x60; // version 01, independent blocks, no checksums, no content size
  private static final byte BD = 0x70; // block maximum size 4 MiB
  static final int BLOCK = 4 << 20;
  private static final int UNCOMPRESSED_BLOCK = 0x80000000;
  private static final int HEADER = 7; // magic, FLG, BD, header checksum
  private static final byte HC = headerChecksum();

  private final Lz4Compressor blocks = new Lz4Compressor();

  @Override
  public CompressionUtil.CodecType getCodecType() {
    return CompressionUtil.CodecType.LZ4_FRAME;
  }

  /** The largest frame {@code length} bytes become: the header, each block at LZ4's bound and its size, the end. */
  long maxFrameLength(long length) {
    long count = Math.max(1, (length + BLOCK - 1) / BLOCK);
    return HEADER + count * (4L + blocks.maxCompressedLength((int) Math.min(length, BLOCK))) + 4;
  }

  @Override
  protected ArrowBuf doCompress(BufferAllocator allocator, ArrowBuf uncompressed) {
    long length = uncompressed.writerIndex();
    long prefix = CompressionUtil.SIZE_OF_UNCOMPRESSED_LENGTH;
    ArrowBuf out = allocator.buffer(prefix + maxFrameLength(length));
    long used;
    try {
      ByteBuffer dst = out.nioBuffer(prefix, (int) (out.capacity() - prefix)).order(ByteOrder.LITTLE_ENDIAN);
      dst.putInt(MAGIC).put(FLG).put(BD).put(HC);
      for (long at = 0; at < length; at += BLOCK) {
        int n = (int) Math.min(BLOCK, length - at);
        int sizeAt = dst.position();
        dst.position(sizeAt + 4);
        blocks.compress(uncompressed.nioBuffer(at, n), dst);
        int packed = dst.position() - sizeAt - 4;
        if (packed >= n) { // LZ4 did not shrink it: the block goes stored
          dst.position(sizeAt + 4);
          dst.put(uncompressed.nioBuffer(at, n));
          dst.putInt(sizeAt, n | UNCOMPRESSED_BLOCK);
        } else {
          dst.putInt(sizeAt, packed);
        }
      }
      dst.putInt(0); // end mark
      used = prefix + dst.position();
      out.writerIndex(used);
    } catch (RuntimeException e) {
      out.close();
      throw e;
    }
    if (used >= out.capacity() / 4 * 3) {
      return out;
    }
    try (ArrowBuf bound = out) { // what the cache holds is what the batch compressed to
      ArrowBuf exact = allocator.buffer(used);
      exact.setBytes(0, bound, 0, used);
      exact.writerIndex(used);
      return exact;
    }
  }

  @Override
  public ArrowBuf decompress(BufferAllocator allocator, ArrowBuf compressed) {
    return new Lz4CompressionCodec().decompress(allocator, compressed);
  }

  @Override
  protected ArrowBuf doDecompress(BufferAllocator allocator, ArrowBuf compressed) {
    throw new UnsupportedOperationException("decompress() delegates to arrow-compression's LZ4_FRAME codec");
  }

  /** The descriptor's checksum: the second byte of xxHash32 (seed 0) of FLG and BD. */
  private static byte headerChecksum() {
    XXHash32 h = new XXHash32();
    h.update(new byte[] {FLG, BD}, 0, 2);
    return (byte) (h.getValue() >> 8);
  }
}
