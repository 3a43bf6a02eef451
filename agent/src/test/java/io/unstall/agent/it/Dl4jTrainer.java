package io.unstall.agent.it;

import java.io.BufferedOutputStream;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.FilterOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;
import org.deeplearning4j.nn.conf.MultiLayerConfiguration;
import org.deeplearning4j.nn.conf.NeuralNetConfiguration;
import org.deeplearning4j.nn.conf.layers.DenseLayer;
import org.deeplearning4j.nn.conf.layers.OutputLayer;
import org.deeplearning4j.nn.multilayer.MultiLayerNetwork;
import org.deeplearning4j.util.ModelSerializer;
import org.nd4j.linalg.activations.Activation;
import org.nd4j.linalg.api.ndarray.INDArray;
import org.nd4j.linalg.dataset.DataSet;
import org.nd4j.linalg.dataset.api.DataSetPreProcessor;
import org.nd4j.linalg.dataset.api.iterator.DataSetIterator;
import org.nd4j.linalg.factory.Nd4j;
import org.nd4j.linalg.learning.config.Adam;
import org.nd4j.linalg.lossfunctions.LossFunctions;

/**
 * Trains a small MLP with Deeplearning4j on batches read from files, with a deliberately bad
 * access pattern: every batch file is read in 4 KiB requests and re-read every epoch. The agent
 * finds DataSetIterator.next() by interface, with no option. With a checkpoint directory it also
 * saves the model and its updater state after every epoch, on the training thread, through a 4 KiB
 * buffer (so in 4 KiB write calls), and syncs each checkpoint once.
 */
public final class Dl4jTrainer {
  public static final int ROWS = 128;
  public static final int FEATURES = 28;
  public static final int CLASSES = 4;
  /** One batch file: ROWS x (FEATURES + CLASSES) little-endian floats = 16 KiB. */
  public static final int BATCH_BYTES = ROWS * (FEATURES + CLASSES) * 4;
  public static final int READ_CHUNK = 4096;
  public static final int HIDDEN = 256;
  /** The checkpoint writer's buffer, so the size of its write calls. */
  public static final int CHECKPOINT_CHUNK = 4096;

  /** Reads batch-NNN.bin files; one file per batch. */
  public static final class FileBatchIterator implements DataSetIterator {
    private final List<Path> files;
    private int next;
    private DataSetPreProcessor preProcessor;

    FileBatchIterator(List<Path> files) {
      this.files = files;
    }

    @Override
    public boolean hasNext() {
      return next < files.size();
    }

    @Override
    public DataSet next() {
      return next(ROWS);
    }

    @Override
    public DataSet next(int num) {
      byte[] bytes = new byte[BATCH_BYTES];
      try (FileInputStream in = new FileInputStream(files.get(next++).toFile())) {
        byte[] chunk = new byte[READ_CHUNK];
        int off = 0;
        int n;
        while ((n = in.read(chunk)) != -1) {
          System.arraycopy(chunk, 0, bytes, off, n);
          off += n;
        }
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
      ByteBuffer buf = ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN);
      float[][] x = new float[ROWS][FEATURES];
      float[][] y = new float[ROWS][CLASSES];
      for (int r = 0; r < ROWS; r++) {
        for (int c = 0; c < FEATURES; c++) {
          x[r][c] = buf.getFloat();
        }
        for (int c = 0; c < CLASSES; c++) {
          y[r][c] = buf.getFloat();
        }
      }
      INDArray features = Nd4j.create(x);
      INDArray labels = Nd4j.create(y);
      DataSet ds = new DataSet(features, labels);
      if (preProcessor != null) {
        preProcessor.preProcess(ds);
      }
      return ds;
    }

    @Override
    public int inputColumns() {
      return FEATURES;
    }

    @Override
    public int totalOutcomes() {
      return CLASSES;
    }

    @Override
    public boolean resetSupported() {
      return true;
    }

    /** Synchronous on purpose: the trainer thread itself waits for each read. */
    @Override
    public boolean asyncSupported() {
      return false;
    }

    @Override
    public void reset() {
      next = 0;
    }

    @Override
    public int batch() {
      return ROWS;
    }

    @Override
    public void setPreProcessor(DataSetPreProcessor p) {
      this.preProcessor = p;
    }

    @Override
    public DataSetPreProcessor getPreProcessor() {
      return preProcessor;
    }

    @Override
    public List<String> getLabels() {
      return null;
    }
  }

  /** Writes {@code count} batch files of a learnable problem (label = argmax of 4 features). */
  public static List<Path> writeData(Path dir, int count) throws IOException {
    java.util.Random rnd = new java.util.Random(7);
    java.util.List<Path> files = new java.util.ArrayList<>();
    for (int b = 0; b < count; b++) {
      ByteBuffer buf = ByteBuffer.allocate(BATCH_BYTES).order(ByteOrder.LITTLE_ENDIAN);
      for (int r = 0; r < ROWS; r++) {
        float[] x = new float[FEATURES];
        int best = 0;
        for (int c = 0; c < FEATURES; c++) {
          x[c] = (float) rnd.nextGaussian();
          buf.putFloat(x[c]);
          if (c < CLASSES && x[c] > x[best]) {
            best = c;
          }
        }
        for (int c = 0; c < CLASSES; c++) {
          buf.putFloat(c == best ? 1f : 0f);
        }
      }
      Path f = dir.resolve(String.format("batch-%03d.bin", b));
      java.nio.file.Files.write(f, buf.array());
      files.add(f);
    }
    return files;
  }

  /** One epoch (a method of its own so that CoexistenceIT's official agent can trace it). */
  static void trainEpoch(MultiLayerNetwork net, FileBatchIterator it) {
    it.reset();
    net.fit(it);
  }

  /** Writes checkpoint-EPOCH.zip in 4 KiB writes, then syncs it once. */
  static void checkpoint(MultiLayerNetwork net, Path dir, int epoch) throws IOException {
    Path file = dir.resolve("checkpoint-" + epoch + ".zip");
    try (FileOutputStream fos = new FileOutputStream(file.toFile())) {
      BufferedOutputStream out = new BufferedOutputStream(fos, CHECKPOINT_CHUNK);
      // ModelSerializer closes the stream it is given; keep the file open for the sync.
      ModelSerializer.writeModel(net, new FilterOutputStream(out) {
        @Override
        public void write(byte[] b, int off, int len) throws IOException {
          out.write(b, off, len);
        }

        @Override
        public void close() throws IOException {
          out.flush();
        }
      }, true);
      out.flush();
      fos.getChannel().force(true);
    }
  }

  /** Arguments: data directory, number of batch files, epochs, and optionally a checkpoint directory. */
  public static void main(String[] args) throws Exception {
    Path dir = Paths.get(args[0]);
    int batches = Integer.parseInt(args[1]);
    int epochs = Integer.parseInt(args[2]);
    Path checkpoints = args.length > 3 ? Paths.get(args[3]) : null;
    java.util.List<Path> files = new java.util.ArrayList<>();
    for (int b = 0; b < batches; b++) {
      files.add(dir.resolve(String.format("batch-%03d.bin", b)));
    }
    MultiLayerConfiguration conf =
        new NeuralNetConfiguration.Builder()
            .seed(42)
            .updater(new Adam(0.01))
            .list()
            .layer(new DenseLayer.Builder().nIn(FEATURES).nOut(HIDDEN).activation(Activation.RELU).build())
            .layer(
                new OutputLayer.Builder(LossFunctions.LossFunction.MCXENT)
                    .nIn(HIDDEN)
                    .nOut(CLASSES)
                    .activation(Activation.SOFTMAX)
                    .build())
            .build();
    MultiLayerNetwork net = new MultiLayerNetwork(conf);
    net.init();
    FileBatchIterator it = new FileBatchIterator(files);
    if (checkpoints == null) {
      net.fit(it, epochs);
    } else {
      for (int e = 0; e < epochs; e++) {
        trainEpoch(net, it);
        checkpoint(net, checkpoints, e);
      }
    }
    System.out.println("trained " + epochs + " epochs, score " + net.score());
  }
}
