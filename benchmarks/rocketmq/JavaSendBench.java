// JavaSendBench: the stock RocketMQ 4.9.7 Java producer sending to a cluster (RaftMQ or
// RocketMQ) from T threads for S seconds -- sync sends of one message, or batches of B --
// and printing messages/s and send latency percentiles as one JSON line. Built and run by
// benchmarks/rocketmq/java_bench.sh (issue 27's "Java client against RaftMQ" figures).
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;

public class JavaSendBench {
    public static void main(String[] args) throws Exception {
        String namesrv = args[0];
        String topic = args[1];
        int threads = Integer.parseInt(args[2]);
        int seconds = Integer.parseInt(args[3]);
        int bodyBytes = Integer.parseInt(args[4]);
        int batch = Integer.parseInt(args[5]);
        DefaultMQProducer producer = new DefaultMQProducer("bench-" + System.nanoTime());
        producer.setNamesrvAddr(namesrv);
        producer.setSendMsgTimeout(10_000);
        producer.setInstanceName("bench-" + ProcessHandle.current().pid());
        producer.start();
        byte[] body = new byte[bodyBytes];
        Arrays.fill(body, (byte) 'x');
        AtomicLong sent = new AtomicLong();
        AtomicLong failed = new AtomicLong();
        ConcurrentLinkedQueue<long[]> latencies = new ConcurrentLinkedQueue<>();
        long warmEnd = System.currentTimeMillis() + 2000;
        long end = warmEnd + seconds * 1000L;
        List<Thread> workers = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            Thread w = new Thread(() -> {
                long[] mine = new long[1 << 16];
                int n = 0;
                while (true) {
                    long now = System.currentTimeMillis();
                    if (now >= end) {
                        break;
                    }
                    long started = System.nanoTime();
                    try {
                        SendResult r;
                        if (batch <= 1) {
                            r = producer.send(new Message(topic, body));
                        } else {
                            List<Message> msgs = new ArrayList<>(batch);
                            for (int i = 0; i < batch; i++) {
                                msgs.add(new Message(topic, body));
                            }
                            r = producer.send(msgs);
                        }
                        if (now >= warmEnd) {
                            if (r.getSendStatus() == SendStatus.SEND_OK) {
                                sent.addAndGet(Math.max(batch, 1));
                                if (n < mine.length) {
                                    mine[n++] = System.nanoTime() - started;
                                }
                            } else {
                                failed.incrementAndGet();
                            }
                        }
                    } catch (Exception e) {
                        if (now >= warmEnd) {
                            failed.incrementAndGet();
                        }
                    }
                }
                latencies.add(Arrays.copyOf(mine, n));
            });
            w.start();
            workers.add(w);
        }
        for (Thread w : workers) {
            w.join();
        }
        producer.shutdown();
        long[] all = latencies.stream().flatMapToLong(Arrays::stream).sorted().toArray();
        double p50 = all.length == 0 ? 0 : all[all.length / 2] / 1e6;
        double p99 = all.length == 0 ? 0 : all[(int) (all.length * 0.99)] / 1e6;
        System.out.printf("{\"threads\":%d,\"batch\":%d,\"body_bytes\":%d,\"seconds\":%d,\"msgs_per_s\":%.0f,"
                + "\"failed_sends\":%d,\"p50_ms\":%.2f,\"p99_ms\":%.2f}%n", threads, batch, bodyBytes, seconds,
            sent.get() / (double) seconds, failed.get(), p50, p99);
        System.exit(0);
    }
}
