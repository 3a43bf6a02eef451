package org.apache.parquet;

import org.apache.parquet.bytes.HeapByteBufferAllocator;
import org.apache.parquet.compression.CompressionCodecFactory;
import org.apache.parquet.conf.PlainParquetConfiguration;
import org.apache.parquet.filter2.compat.FilterCompat;
import org.apache.parquet.format.converter.ParquetMetadataConverter;

/**
 * Read options without Hadoop. {@code ParquetReadOptions.builder} always builds Hadoop's codec factory (it loads
 * {@code org.apache.hadoop.io.compress} classes), so the sidecar, which carries no Hadoop, calls the
 * package-private constructor with its own codecs ({@code io.unstall.flight.format.ParquetCodecs}). Page CRCs
 * are verified where the writer stored them.
 */
public final class UnstallReadOptions {
  private UnstallReadOptions() {}

  public static ParquetReadOptions of(CompressionCodecFactory codecs) {
    return new ParquetReadOptions(
        false, // useSignedStringMinMax
        false, // useStatsFilter
        false, // useDictionaryFilter
        false, // useRecordFilter
        false, // useColumnIndexFilter
        true, // usePageChecksumVerification
        false, // useBloomFilter
        false, // useOffHeapDecryptBuffer
        false, // useHadoopVectoredIo
        FilterCompat.NOOP,
        ParquetMetadataConverter.NO_FILTER,
        codecs,
        new HeapByteBufferAllocator(),
        8 << 20, // maxAllocationSize
        java.util.Map.of(),
        null, // fileDecryptionProperties
        null, // metricsCallback
        new PlainParquetConfiguration());
  }
}
