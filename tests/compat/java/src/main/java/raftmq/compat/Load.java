// Scenarios under load: the chaos workload (ordered sends per key through a leader kill,
// an orderly consumer) and the send benchmarks (sync sends from many threads, batches).
package raftmq.compat;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.MessageQueueSelector;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

final class Load {
    private Load() {
    }

    static final MessageQueueSelector BY_KEY = (mqs, msg, arg) -> mqs.get(Math.floorMod(arg.hashCode(), mqs.size()));

    /**
     * keys= threads each send count= messages of one key in order through the selector; a
     * send that fails is sent again (same seq) every retryMs= until it is acknowledged or the
     * deadline passes, so order per key holds and a resend may duplicate. An orderly consumer
     * records every delivery. Ends once every acknowledged message was delivered (exit 0).
     * Events: "sent" (acknowledged), "send-failed" (outcome unknown), "received".
     */
    static void orderedLoad(Harness h) throws Exception {
        h.prepareTopic(h.topic);
        int keys = h.opts.integer("keys", 8);
        long retryMs = h.opts.integer("retryMs", 200);
        Map<String, AtomicInteger> seen = new ConcurrentHashMap<>();
        DefaultMQPushConsumer c = h.pushConsumer(h.group, "c1");
        c.subscribe(h.topic, "*");
        c.registerMessageListener((MessageListenerOrderly) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                Harness.received("c1", m).emit();
                seen.computeIfAbsent(m.getKeys() + "#" + m.getUserProperty("seq"), k -> new AtomicInteger())
                    .incrementAndGet();
            }
            return ConsumeOrderlyStatus.SUCCESS;
        });
        DefaultMQProducer p = h.producer("pg-" + h.runId);
        p.setRetryTimesWhenSendFailed(0);  // resends are the harness's, same seq, same queue
        Set<String> acked = ConcurrentHashMap.newKeySet();
        c.start();
        p.start();
        try {
            List<Thread> senders = new ArrayList<>();
            for (int k = 0; k < keys; k++) {
                String key = "load-" + k;
                Thread t = new Thread(() -> sendKeyInOrder(h, p, key, retryMs, acked), "sender-" + key);
                t.start();
                senders.add(t);
            }
            for (Thread t : senders) {
                t.join(Math.max(1, h.deadlineMs - System.currentTimeMillis()));
            }
            Events.of("sending-done").put("acked", acked.size()).emit();
            h.awaitKeys(new HashSet<>(acked), seen);
        } finally {
            p.shutdown();
            c.shutdown();
        }
    }

    private static void sendKeyInOrder(Harness h, DefaultMQProducer p, String key, long retryMs, Set<String> acked) {
        for (int seq = 0; seq < h.count; seq++) {
            while (System.currentTimeMillis() < h.deadlineMs) {
                Message m = Scenarios.message(h.topic, "TagA", key);
                m.putUserProperty("seq", Integer.toString(seq));
                try {
                    SendResult r = p.send(m, BY_KEY, key);
                    if (r.getSendStatus() == SendStatus.SEND_OK) {
                        acked.add(key + "#" + seq);
                        Events.of("sent").put("mode", "ordered").put("key", key).put("seq", Integer.toString(seq))
                            .put("msgId", r.getMsgId()).put("queue", r.getMessageQueue().getQueueId())
                            .put("broker", r.getMessageQueue().getBrokerName())
                            .put("queueOffset", r.getQueueOffset()).put("status", r.getSendStatus().name()).emit();
                        break;
                    }
                    Events.of("send-failed").put("key", key).put("seq", Integer.toString(seq))
                        .put("error", r.getSendStatus().name()).emit();
                } catch (Exception e) {
                    Events.of("send-failed").put("key", key).put("seq", Integer.toString(seq))
                        .put("error", e.getClass().getSimpleName() + ": " + e.getMessage()).emit();
                }
                try {
                    Thread.sleep(retryMs);
                } catch (InterruptedException ie) {
                    Thread.currentThread().interrupt();
                    return;
                }
            }
        }
    }

    /** threads= threads each send sync until count= messages of size= bytes went; one "bench" event. */
    static void benchSync(Harness h) throws Exception {
        h.prepareTopic(h.topic);
        int threads = h.opts.integer("threads", 64);
        byte[] body = payload(h.opts.integer("size", 256));
        DefaultMQProducer p = h.producer("pg-" + h.runId);
        p.start();
        try {
            warmUp(h, p, body);
            AtomicLong left = new AtomicLong(h.count);
            AtomicLong failed = new AtomicLong();
            long start = System.nanoTime();
            List<Thread> workers = new ArrayList<>();
            for (int i = 0; i < threads; i++) {
                Thread t = new Thread(() -> {
                    while (left.getAndDecrement() > 0 && System.currentTimeMillis() < h.deadlineMs) {
                        try {
                            p.send(new Message(h.topic, "TagA", body));
                        } catch (Exception e) {
                            failed.incrementAndGet();
                        }
                    }
                });
                t.start();
                workers.add(t);
            }
            for (Thread t : workers) {
                t.join();
            }
            bench("sync", h.count, failed.get(), start, threads, body.length, 1);
        } finally {
            p.shutdown();
        }
    }

    /** Batches of batch= messages of size= bytes from threads= threads, count= messages in all. */
    static void benchBatch(Harness h) throws Exception {
        h.prepareTopic(h.topic);
        int threads = h.opts.integer("threads", 8);
        int batch = h.opts.integer("batch", 16);
        byte[] body = payload(h.opts.integer("size", 256));
        DefaultMQProducer p = h.producer("pg-" + h.runId);
        p.start();
        try {
            warmUp(h, p, body);
            AtomicLong left = new AtomicLong(h.count / batch);
            AtomicLong failed = new AtomicLong();
            long start = System.nanoTime();
            List<Thread> workers = new ArrayList<>();
            for (int i = 0; i < threads; i++) {
                Thread t = new Thread(() -> {
                    List<Message> msgs = new ArrayList<>();
                    for (int j = 0; j < batch; j++) {
                        msgs.add(new Message(h.topic, "TagA", body));
                    }
                    while (left.getAndDecrement() > 0 && System.currentTimeMillis() < h.deadlineMs) {
                        try {
                            p.send(msgs);
                        } catch (Exception e) {
                            failed.addAndGet(batch);
                        }
                    }
                });
                t.start();
                workers.add(t);
            }
            for (Thread t : workers) {
                t.join();
            }
            bench("batch", (h.count / batch) * batch, failed.get(), start, threads, body.length, batch);
        } finally {
            p.shutdown();
        }
    }

    private static void warmUp(Harness h, DefaultMQProducer p, byte[] body) throws Exception {
        for (int i = 0; i < 50; i++) {
            p.send(new Message(h.topic, "TagA", body));
        }
    }

    private static byte[] payload(int size) {
        byte[] b = new byte[size];
        Arrays.fill(b, (byte) 'x');
        return b;
    }

    private static void bench(String mode, long messages, long failed, long startNs, int threads, int size,
        int batch) {
        double seconds = (System.nanoTime() - startNs) / 1e9;
        Events.of("bench").put("mode", mode).put("messages", messages).put("failed", failed)
            .put("seconds", Math.round(seconds * 1000) / 1000.0).put("threads", threads).put("size", size)
            .put("batch", batch).put("msgsPerS", Math.round((messages - failed) / seconds)).emit();
    }
}
