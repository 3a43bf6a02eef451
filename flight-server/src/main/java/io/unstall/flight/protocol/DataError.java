package io.unstall.flight.protocol;

import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.arrow.flight.CallStatus;
import org.apache.arrow.flight.FlightRuntimeException;

/**
 * Bad data, not a bug: a sample or a stored file that fails its format's or the decoder's checks (a corrupt
 * record, a truncated file, a decompression bomb). Clients get it as {@code INVALID_ARGUMENT} whose description
 * starts with a line of {@link #MARKER} and these fields as a JSON object, then the message (protocol/README.md,
 * "Errors"), so the kind and the sample never have to be read from the message. Unknown fields ({@code null},
 * or -1 for {@code sample} and {@code offset}) are left out of the JSON.
 *
 * @param dataset the registered dataset's name
 * @param sample the sample id
 * @param key the sample's key (as in the batch schema's {@code key} column)
 * @param file the file at fault, as storage names it
 * @param offset the byte offset in {@code file} of the record or structure at fault (a bad image: where the
 *     sample's bytes start)
 * @param reason what is wrong, in words
 */
public record DataError(String dataset, long sample, String key, String file, long offset, String reason) {
  /** Starts a data error's description: the JSON object of the fields follows on that line. */
  public static final String MARKER = "unstall.data-error: ";

  /** The same error, named with the dataset and the sample it was read for. */
  public DataError inSample(String dataset, long sample, String key) {
    return new DataError(dataset, sample, key, file, offset, reason);
  }

  /** The same error, named with the dataset (a file refused while the dataset was being indexed). */
  public DataError inDataset(String dataset) {
    return new DataError(dataset, sample, key, file, offset, reason);
  }

  /** The fields as the marker line's JSON object, in this order. */
  public ObjectNode fields() {
    ObjectNode o = JsonNodeFactory.instance.objectNode();
    if (dataset != null) {
      o.put("dataset", dataset);
    }
    if (sample >= 0) {
      o.put("sample", sample);
    }
    if (key != null) {
      o.put("key", key);
    }
    if (file != null) {
      o.put("file", file);
    }
    if (offset >= 0) {
      o.put("offset", offset);
    }
    if (reason != null) {
      o.put("reason", reason);
    }
    return o;
  }

  /** The marker line, then {@code message}. */
  public String describe(String message) {
    return MARKER + fields() + "\n" + message;
  }

  /** The status a client sees: {@code INVALID_ARGUMENT} with {@link #describe} as its description. */
  public FlightRuntimeException toStatus(String message, Throwable cause) {
    return CallStatus.INVALID_ARGUMENT.withDescription(describe(message)).withCause(cause).toRuntimeException();
  }
}
