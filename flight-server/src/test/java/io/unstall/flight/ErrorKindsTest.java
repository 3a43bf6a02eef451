package io.unstall.flight;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertSame;

import io.unstall.flight.format.CorruptRecordException;
import io.unstall.flight.protocol.DataError;
import java.io.IOException;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.flight.FlightStatusCode;
import org.junit.jupiter.api.Test;

/** What kind of error a client is told: bad data (with its marker line), a bad request, or an internal fault. */
class ErrorKindsTest {
  @Test
  void aCorruptRecordIsBadDataNamingTheSampleItWasReadFor() {
    CorruptRecordException read = new CorruptRecordException("/d/s-0.tfrecord", 96,
        "corrupt TFRecord record in '/d/s-0.tfrecord' at byte offset 96: data CRC32C mismatch");
    FlightRuntimeException status = UnstallProducer.toStatus(read.inSample("tf", 3, "s-0.tfrecord@96"));
    assertEquals(FlightStatusCode.INVALID_ARGUMENT, status.status().code());
    assertEquals(DataError.MARKER + "{\"dataset\":\"tf\",\"sample\":3,\"key\":\"s-0.tfrecord@96\",\"file\":"
        + "\"/d/s-0.tfrecord\",\"offset\":96,\"reason\":\"" + read.getMessage() + "\"}\n"
        + "dataset 'tf' sample 3 ('s-0.tfrecord@96'): " + read.getMessage(), status.getMessage());
  }

  @Test
  void aFileRefusedAtIndexingIsBadDataNamingTheDatasetAndLeavesOutWhatIsUnknown() {
    CorruptRecordException indexing = new CorruptRecordException("/d/x.parquet", -1, "cannot read its footer")
        .inDataset("pq");
    FlightRuntimeException status = UnstallProducer.toStatus(indexing);
    assertEquals(FlightStatusCode.INVALID_ARGUMENT, status.status().code());
    assertEquals(DataError.MARKER
        + "{\"dataset\":\"pq\",\"file\":\"/d/x.parquet\",\"reason\":\"cannot read its footer\"}"
        + "\ncannot read its footer", status.getMessage());
  }

  @Test
  void aFaultOfTheSidecarItselfStaysInternalWithoutTheMarker() {
    for (Throwable bug : new Throwable[] {new NullPointerException("x is null"), new IOException("EIO")}) {
      FlightRuntimeException status = UnstallProducer.toStatus(bug);
      assertEquals(FlightStatusCode.INTERNAL, status.status().code(), bug.toString());
      assertFalse(status.getMessage().contains(DataError.MARKER), status.getMessage());
      assertSame(bug, status.getCause());
    }
    FlightRuntimeException request = UnstallProducer.toStatus(new IllegalArgumentException("bad option"));
    assertEquals(FlightStatusCode.INVALID_ARGUMENT, request.status().code());
    assertEquals("bad option", request.getMessage(), "a bad request carries no marker");
  }
}
