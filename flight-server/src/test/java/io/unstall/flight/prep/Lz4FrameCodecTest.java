package io.unstall.flight.prep;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.util.Random;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.compression.CompressionUtil;
import org.apache.commons.compress.compressors.lz4.FramedLZ4CompressorInputStream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

class Lz4FrameCodecTest {

  /** Bytes in runs, as flat image regions are (compressible), or pure noise (stored blocks). */
  private static byte[] data(int length, boolean noise, long seed) {
    Random r = new Random(seed);
    byte[] b = new byte[length];
    int v = 128;
    for (int i = 0; i < length; i++) {
      v = noise ? r.nextInt(256) : r.nextInt(8) == 0 ? r.nextInt(256) : v;
      b[i] = (byte) v;
    }
    return b;
  }

  private static ArrowBuf buffer(BufferAllocator a, byte[] bytes) {
    ArrowBuf b = a.buffer(Math.max(1, bytes.length));
    b.setBytes(0, bytes);
    b.writerIndex(bytes.length);
    return b;
  }

  /** The frame after the 8-byte length prefix, read by commons-compress (an independent LZ4 frame reader). */
  private static byte[] readBack(ArrowBuf compressed) throws IOException {
    long prefix = CompressionUtil.SIZE_OF_UNCOMPRESSED_LENGTH;
    byte[] frame = new byte[(int) (compressed.writerIndex() - prefix)];
    compressed.getBytes(prefix, frame);
    try (FramedLZ4CompressorInputStream in = new FramedLZ4CompressorInputStream(new ByteArrayInputStream(frame))) {
      return in.readAllBytes();
    }
  }

  @ParameterizedTest
  @ValueSource(ints = {1000, 150_528, Lz4FrameCodec.BLOCK, Lz4FrameCodec.BLOCK + 1, 9_633_792})
  void framesAreReadBackByAnotherImplementationByteForByte(int length) throws IOException {
    byte[] raw = data(length, false, length);
    try (BufferAllocator a = new RootAllocator()) {
      try (ArrowBuf c = new Lz4FrameCodec().compress(a, buffer(a, raw))) {
        assertEquals(length, c.getLong(0), "the uncompressed length prefix");
        assertArrayEquals(raw, readBack(c));
        assertTrue(c.writerIndex() < length, "runs shrink");
        c.getReferenceManager().retain(); // decompress() releases its input
        try (ArrowBuf back = new Lz4FrameCodec().decompress(a, c)) {
          byte[] got = new byte[length];
          back.getBytes(0, got);
          assertArrayEquals(raw, got, "arrow-compression's decompression reads it too");
        }
      }
      assertEquals(0, a.getAllocatedMemory());
    }
  }

  @Test
  void incompressibleBlocksAreStoredAndTheCodecKeepsOnlyWhatItUsed() throws IOException {
    int length = Lz4FrameCodec.BLOCK + 4096;
    byte[] raw = data(length, true, 7);
    try (BufferAllocator a = new RootAllocator()) {
      ArrowBuf in = buffer(a, raw);
      try (ArrowBuf frame = new Lz4FrameCodec().doCompress(a, in)) {
        // magic, descriptor, two stored blocks with their sizes, end mark
        assertEquals(8 + 7 + 4 + Lz4FrameCodec.BLOCK + 4 + 4096 + 4, frame.writerIndex());
        assertNotEquals(0, frame.getInt(8 + 7) & 0x80000000, "the stored-block bit");
        assertArrayEquals(raw, readBack(frame));
      }
      in.close();
      // compress() itself sends such a buffer raw (length -1), as every Arrow codec does
      try (ArrowBuf c = new Lz4FrameCodec().compress(a, buffer(a, raw))) {
        assertEquals(CompressionUtil.NO_COMPRESSION_LENGTH, c.getLong(0));
      }
      assertEquals(0, a.getAllocatedMemory());
    }
  }

  @Test
  void aBufferTooSmallToShrinkIsSentRaw() {
    try (BufferAllocator a = new RootAllocator();
        ArrowBuf c = new Lz4FrameCodec().compress(a, buffer(a, new byte[] {42}))) {
      assertEquals(CompressionUtil.NO_COMPRESSION_LENGTH, c.getLong(0));
      assertEquals(42, c.getByte(CompressionUtil.SIZE_OF_UNCOMPRESSED_LENGTH));
    }
  }

  @Test
  void anEmptyBufferIsJustItsLength() {
    try (BufferAllocator a = new RootAllocator();
        ArrowBuf c = new Lz4FrameCodec().compress(a, buffer(a, new byte[0]))) {
      assertEquals(CompressionUtil.SIZE_OF_UNCOMPRESSED_LENGTH, c.writerIndex());
      assertEquals(0, c.getLong(0));
    }
  }
}
