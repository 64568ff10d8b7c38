// The scenarios: each starts the clients it needs, sends, waits (with the harness's
// deadline) for what it expects and shuts its clients down, so that a capture of the
// conversation includes the clients' unregistering.
package raftmq.compat;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.MessageSelector;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.common.protocol.heartbeat.MessageModel;
import org.apache.rocketmq.common.protocol.route.QueueData;
import org.apache.rocketmq.common.protocol.route.TopicRouteData;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

final class Scenarios {
    private Scenarios() {
    }

    static void run(Harness h) throws Exception {
        switch (h.opts.scenario) {
            case "produce" -> produce(h);
            case "consume" -> consume(h);
            case "sends" -> sends(h);
            case "ordered" -> ordered(h);
            case "tags" -> tags(h);
            case "sql" -> sql(h);
            case "broadcast" -> broadcast(h);
            case "delay" -> delay(h);
            case "retry-dlq" -> retryDlq(h);
            case "transaction" -> transaction(h);
            case "litepull" -> litePull(h);
            case "acl" -> acl(h);
            case "ordered-load" -> Load.orderedLoad(h);
            case "bench-sync" -> Load.benchSync(h);
            case "bench-batch" -> Load.benchBatch(h);
            default -> throw new IllegalArgumentException("unknown scenario " + h.opts.scenario
                + " (produce consume sends ordered tags sql broadcast delay retry-dlq transaction litepull acl"
                + " ordered-load bench-sync bench-batch)");
        }
    }

    static Message message(String topic, String tags, String key) {
        return new Message(topic, tags, key, ("body of " + key).getBytes(StandardCharsets.UTF_8));
    }

    static void sent(String mode, String key, SendResult r) {
        Events.of("sent").put("mode", mode).put("key", key).put("msgId", r.getMsgId())
            .put("offsetMsgId", r.getOffsetMsgId()).put("broker", r.getMessageQueue().getBrokerName())
            .put("queue", r.getMessageQueue().getQueueId()).put("queueOffset", r.getQueueOffset())
            .put("status", r.getSendStatus().name()).emit();
    }

    /** A clustering push consumer recording every delivery into `seen` (key -> deliveries). */
    static DefaultMQPushConsumer recordingConsumer(Harness h, String name, Map<String, AtomicInteger> seen)
        throws Exception {
        DefaultMQPushConsumer c = h.pushConsumer(h.group, name);
        c.subscribe(h.topic, "*");
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                Harness.received(name, m).emit();
                seen.computeIfAbsent(m.getKeys(), k -> new AtomicInteger()).incrementAndGet();
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        return c;
    }

    // ---- produce / consume: the two halves, for captures ------------------------------------

    /** Sync sends then one batch: producer start, route, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE. */
    static void produce(Harness h) throws Exception {
        h.prepareTopic(h.topic);
        DefaultMQProducer p = h.producer("pg-" + h.runId);
        p.start();
        try {
            for (int i = 0; i < h.count; i++) {
                String key = "sync-" + i;
                sent("sync", key, p.send(message(h.topic, "TagA", key)));
            }
            sendBatch(h, p, "batch-", h.count);
        } finally {
            p.shutdown();
        }
    }

    static void sendBatch(Harness h, DefaultMQProducer p, String prefix, int n) throws Exception {
        List<Message> batch = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            batch.add(message(h.topic, "TagA", prefix + i));
        }
        SendResult r = p.send(batch);
        String[] ids = r.getMsgId() == null ? new String[0] : r.getMsgId().split(",");
        for (int i = 0; i < n; i++) {
            Events.of("sent").put("mode", "batch").put("key", prefix + i)
                .put("msgId", i < ids.length ? ids[i] : null).put("broker", r.getMessageQueue().getBrokerName())
                .put("queue", r.getMessageQueue().getQueueId()).put("queueOffset", r.getQueueOffset() + i)
                .put("status", r.getSendStatus().name()).emit();
        }
    }

    /** A push consumer until `count` messages arrived; its shutdown commits the offsets. */
    static void consume(Harness h) throws Exception {
        h.prepareTopic(h.topic);
        Map<String, AtomicInteger> seen = new ConcurrentHashMap<>();
        DefaultMQPushConsumer c = recordingConsumer(h, "c1", seen);
        c.start();
        try {
            h.awaitTrue(h.count + " messages", () -> seen.size() >= h.count);
        } finally {
            c.shutdown();
        }
    }

    // ---- acl: signed with AclClientRPCHook (Harness.aclHook), allowed and refused --------------

    /**
     * Sync sends to the scenario's topic, all received by a push consumer; then one send to
     * `deniedTopic`, which must be refused: a "refused" event with the broker's code and remark
     * (a "sent" event for it would mean it was stored).
     */
    static void acl(Harness h) throws Exception {
        String denied = h.opts.str("deniedTopic", null);
        if (denied == null) {
            throw new IllegalArgumentException("acl needs deniedTopic=");
        }
        h.prepareTopic(h.topic);
        h.prepareTopic(denied);
        Map<String, AtomicInteger> seen = new ConcurrentHashMap<>();
        DefaultMQPushConsumer c = recordingConsumer(h, "c1", seen);
        DefaultMQProducer p = h.producer("pg-" + h.runId);
        Set<String> expected = new HashSet<>();
        c.start();
        p.start();
        try {
            syncSends(h, p, "acl-", expected);
            h.awaitKeys(expected, seen);
            try {
                sent("sync", "denied-0", p.send(message(denied, "TagA", "denied-0")));
            } catch (MQClientException e) {
                refused(denied, e.getResponseCode(), e);
            } catch (MQBrokerException e) {
                refused(denied, e.getResponseCode(), e);
            }
        } finally {
            p.shutdown();
            c.shutdown();
        }
    }

    static void refused(String topic, int code, Exception e) {
        Events.of("refused").put("topic", topic).put("code", code).put("message", Harness.causes(e)).emit();
    }

    /** Sync sends of keys `prefix`0.. to the scenario's topic, each a "sent" event; the keys into `expected`. */
    static void syncSends(Harness h, DefaultMQProducer p, String prefix, Set<String> expected) throws Exception {
        for (int i = 0; i < h.count; i++) {
            String key = prefix + i;
            expected.add(key);
            sent("sync", key, p.send(message(h.topic, "TagA", key)));
        }
    }

    // ---- sends: sync, async, oneway, batch, all received ---------------------------------

    static void sends(Harness h) throws Exception {
        h.prepareTopic(h.topic);
        Map<String, AtomicInteger> seen = new ConcurrentHashMap<>();
        DefaultMQPushConsumer c = recordingConsumer(h, "c1", seen);
        DefaultMQProducer p = h.producer("pg-" + h.runId);
        Set<String> expected = new HashSet<>();
        c.start();
        p.start();
        try {
            syncSends(h, p, "sync-", expected);
            AtomicInteger asyncDone = new AtomicInteger();
            for (int i = 0; i < h.count; i++) {
                String key = "async-" + i;
                expected.add(key);
                p.send(message(h.topic, "TagA", key), new SendCallback() {
                    @Override
                    public void onSuccess(SendResult r) {
                        sent("async", key, r);
                        asyncDone.incrementAndGet();
                    }

                    @Override
                    public void onException(Throwable e) {
                        Events.of("send-failed").put("mode", "async").put("key", key)
                            .put("error", String.valueOf(e)).emit();
                        asyncDone.incrementAndGet();
                    }
                });
            }
            for (int i = 0; i < h.count; i++) {
                String key = "oneway-" + i;
                expected.add(key);
                p.sendOneway(message(h.topic, "TagA", key));
                Events.of("sent").put("mode", "oneway").put("key", key).put("status", "ONEWAY").emit();
            }
            sendBatch(h, p, "batch-", h.count);
            for (int i = 0; i < h.count; i++) {
                expected.add("batch-" + i);
            }
            h.awaitTrue("async send callbacks", () -> asyncDone.get() == h.count);
            h.awaitKeys(expected, seen);
        } finally {
            p.shutdown();
            c.shutdown();
        }
    }

    // ---- ordered: MessageQueueSelector + orderly push consumer ------------------------------

    static void ordered(Harness h) throws Exception {
        h.prepareTopic(h.topic);
        int keys = h.opts.integer("keys", 8);
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
        Set<String> expected = new HashSet<>();
        c.start();
        p.start();
        try {
            for (int seq = 0; seq < h.count; seq++) {
                for (int k = 0; k < keys; k++) {
                    String key = "ord-" + k;
                    Message m = message(h.topic, "TagA", key);
                    m.putUserProperty("seq", Integer.toString(seq));
                    SendResult r = p.send(m, (mqs, msg, arg) -> mqs.get(Math.floorMod(arg.hashCode(), mqs.size())), key);
                    expected.add(key + "#" + seq);
                    Events.of("sent").put("mode", "ordered").put("key", key).put("seq", Integer.toString(seq))
                        .put("msgId", r.getMsgId()).put("queue", r.getMessageQueue().getQueueId())
                        .put("queueOffset", r.getQueueOffset()).put("status", r.getSendStatus().name()).emit();
                }
            }
            h.awaitKeys(expected, seen);
        } finally {
            p.shutdown();
            c.shutdown();
        }
    }

    // ---- filters: tags and SQL92 ------------------------------------------------------------

    /** Non-matching messages go first, so any that leaked would arrive before the last match. */
    static void tags(Harness h) throws Exception {
        h.prepareTopic(h.topic);
        Map<String, AtomicInteger> seen = new ConcurrentHashMap<>();
        DefaultMQPushConsumer c = h.pushConsumer(h.group, "c1");
        c.subscribe(h.topic, "TagA || TagB");
        listenInto(c, "c1", seen);
        filtered(h, c, seen, new String[][] {{"TagC", "tagc-"}}, new String[][] {{"TagA", "taga-"}, {"TagB", "tagb-"}},
            null);
    }

    static void sql(Harness h) throws Exception {
        h.prepareTopic(h.topic);
        Map<String, AtomicInteger> seen = new ConcurrentHashMap<>();
        DefaultMQPushConsumer c = h.pushConsumer(h.group, "c1");
        c.subscribe(h.topic, MessageSelector.bySql("region = 'eu' AND amount > 100"));
        listenInto(c, "c1", seen);
        filtered(h, c, seen, new String[][] {{"us", "sqlno-us-", "500"}, {"eu", "sqlno-small-", "50"}},
            new String[][] {{"eu", "sqlyes-", "150"}}, "sql");
    }

    static void listenInto(DefaultMQPushConsumer c, String name, Map<String, AtomicInteger> seen) {
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                Harness.received(name, m).emit();
                seen.computeIfAbsent(m.getKeys(), k -> new AtomicInteger()).incrementAndGet();
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
    }

    /** Rows are {tag, keyPrefix} (tags) or {region, keyPrefix, amount} (sql). */
    static void filtered(Harness h, DefaultMQPushConsumer c, Map<String, AtomicInteger> seen, String[][] unwanted,
        String[][] wanted, String mode) throws Exception {
        DefaultMQProducer p = h.producer("pg-" + h.runId);
        Set<String> expected = new HashSet<>();
        c.start();
        p.start();
        try {
            for (String[][] rows : new String[][][] {unwanted, wanted}) {
                for (String[] row : rows) {
                    for (int i = 0; i < h.count; i++) {
                        String key = row[1] + i;
                        Message m;
                        if ("sql".equals(mode)) {
                            m = message(h.topic, "TagA", key);
                            m.putUserProperty("region", row[0]);
                            m.putUserProperty("amount", row[2]);
                        } else {
                            m = message(h.topic, row[0], key);
                        }
                        if (rows == wanted) {
                            expected.add(key);
                        }
                        sent(rows == wanted ? "wanted" : "unwanted", key, p.send(m));
                    }
                }
            }
            h.awaitKeys(expected, seen);
        } finally {
            p.shutdown();
            c.shutdown();
        }
    }

    // ---- broadcast --------------------------------------------------------------------------

    static void broadcast(Harness h) throws Exception {
        h.prepareTopic(h.topic);
        Map<String, AtomicInteger> seen1 = new ConcurrentHashMap<>();
        Map<String, AtomicInteger> seen2 = new ConcurrentHashMap<>();
        List<DefaultMQPushConsumer> consumers = new ArrayList<>();
        for (String name : new String[] {"b1", "b2"}) {
            DefaultMQPushConsumer c = h.pushConsumer(h.group, name);
            c.setMessageModel(MessageModel.BROADCASTING);
            c.subscribe(h.topic, "*");
            listenInto(c, name, name.equals("b1") ? seen1 : seen2);
            consumers.add(c);
        }
        DefaultMQProducer p = h.producer("pg-" + h.runId);
        Set<String> expected = new HashSet<>();
        for (DefaultMQPushConsumer c : consumers) {
            c.start();
        }
        p.start();
        try {
            for (int i = 0; i < h.count; i++) {
                String key = "bc-" + i;
                expected.add(key);
                sent("sync", key, p.send(message(h.topic, "TagA", key)));
            }
            h.awaitKeys(expected, seen1);
            h.awaitKeys(expected, seen2);
        } finally {
            p.shutdown();
            for (DefaultMQPushConsumer c : consumers) {
                c.shutdown();
            }
        }
    }

    // ---- delay level ------------------------------------------------------------------------

    static void delay(Harness h) throws Exception {
        h.prepareTopic(h.topic);
        int level = h.opts.integer("level", 3);
        Map<String, AtomicInteger> seen = new ConcurrentHashMap<>();
        DefaultMQPushConsumer c = recordingConsumer(h, "c1", seen);
        DefaultMQProducer p = h.producer("pg-" + h.runId);
        Set<String> expected = new HashSet<>();
        c.start();
        p.start();
        try {
            for (int i = 0; i < h.count; i++) {
                String key = "delay-" + i;
                Message m = message(h.topic, "TagA", key);
                m.setDelayTimeLevel(level);
                expected.add(key);
                sent("delay", key, p.send(m));
            }
            h.awaitKeys(expected, seen);
        } finally {
            p.shutdown();
            c.shutdown();
        }
    }

    // ---- RECONSUME_LATER -> retry -> DLQ -------------------------------------------------------

    static void retryDlq(Harness h) throws Exception {
        h.prepareTopic(h.topic);
        int maxReconsume = h.opts.integer("maxReconsumeTimes", 2);
        int retryLevel = h.opts.integer("retryLevel", 1);
        Map<String, AtomicInteger> seen = new ConcurrentHashMap<>();
        DefaultMQPushConsumer c = h.pushConsumer(h.group, "c1");
        c.setMaxReconsumeTimes(maxReconsume);
        c.subscribe(h.topic, "*");
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                Harness.received("c1", m).emit();
                seen.computeIfAbsent(m.getKeys() + "#" + m.getReconsumeTimes(), k -> new AtomicInteger())
                    .incrementAndGet();
            }
            ctx.setDelayLevelWhenNextConsume(retryLevel);
            return ConsumeConcurrentlyStatus.RECONSUME_LATER;
        });
        DefaultMQProducer p = h.producer("pg-" + h.runId);
        Set<String> expected = new HashSet<>();
        c.start();
        p.start();
        try {
            for (int i = 0; i < h.count; i++) {
                String key = "retry-" + i;
                for (int t = 0; t <= maxReconsume; t++) {
                    expected.add(key + "#" + t);
                }
                sent("sync", key, p.send(message(h.topic, "TagA", key)));
            }
            h.awaitKeys(expected, seen);
            String dlq = "%DLQ%" + h.group;
            DefaultMQAdminExt a = h.admin();
            try {
                long[] total = {0};
                h.awaitTrue("all " + h.count + " messages in " + dlq, () -> {
                    total[0] = dlqCount(a, dlq);
                    return total[0] >= h.count;
                });
                Events.of("dlq").put("topic", dlq).put("count", total[0]).emit();
            } finally {
                a.shutdown();
            }
        } finally {
            p.shutdown();
            c.shutdown();
        }
    }

    /** Messages in a topic by its queues' max offsets; -1 while the name server has no route. */
    static long dlqCount(DefaultMQAdminExt a, String topic) {
        try {
            TopicRouteData route = a.examineTopicRouteInfo(topic);
            long total = 0;
            for (QueueData q : route.getQueueDatas()) {
                for (int i = 0; i < q.getWriteQueueNums(); i++) {
                    total += a.maxOffset(new MessageQueue(topic, q.getBrokerName(), i));
                }
            }
            return total;
        } catch (Exception e) {
            return -1;
        }
    }

    // ---- transactions: half, commit/rollback/unknown, checkLocalTransaction -------------------

    static void transaction(Harness h) throws Exception {
        h.prepareTopic(h.topic);
        Map<String, AtomicInteger> seen = new ConcurrentHashMap<>();
        Map<String, AtomicInteger> checked = new ConcurrentHashMap<>();
        DefaultMQPushConsumer c = recordingConsumer(h, "c1", seen);
        TransactionMQProducer p = new TransactionMQProducer("tpg-" + h.runId);
        h.configure(p);
        p.setTransactionListener(new TransactionListener() {
            @Override
            public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                String key = msg.getKeys();
                if (key.startsWith("tx-commit-")) {
                    return LocalTransactionState.COMMIT_MESSAGE;
                }
                if (key.startsWith("tx-rollback-")) {
                    return LocalTransactionState.ROLLBACK_MESSAGE;
                }
                return LocalTransactionState.UNKNOW;
            }

            @Override
            public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                Events.of("check").put("key", msg.getKeys()).put("transactionId", msg.getTransactionId())
                    .put("topic", msg.getTopic()).emit();
                checked.computeIfAbsent(msg.getKeys(), k -> new AtomicInteger()).incrementAndGet();
                return LocalTransactionState.COMMIT_MESSAGE;
            }
        });
        Set<String> expected = new HashSet<>();
        Set<String> unknown = new HashSet<>();
        c.start();
        p.start();
        try {
            for (String kind : new String[] {"commit", "rollback", "unknown"}) {
                for (int i = 0; i < h.count; i++) {
                    String key = "tx-" + kind + "-" + i;
                    TransactionSendResult r = p.sendMessageInTransaction(message(h.topic, "TagA", key), null);
                    if (!kind.equals("rollback")) {
                        expected.add(key);
                    }
                    if (kind.equals("unknown")) {
                        unknown.add(key);
                    }
                    Events.of("sent").put("mode", "transaction").put("key", key).put("msgId", r.getMsgId())
                        .put("transactionId", r.getTransactionId()).put("queue", r.getMessageQueue().getQueueId())
                        .put("status", r.getSendStatus().name())
                        .put("localState", r.getLocalTransactionState().name()).emit();
                }
            }
            h.awaitKeys(unknown, checked);
            h.awaitKeys(expected, seen);
        } finally {
            p.shutdown();
            c.shutdown();
        }
    }

    // ---- lite pull consumer -----------------------------------------------------------------

    static void litePull(Harness h) throws Exception {
        h.prepareTopic(h.topic);
        DefaultLitePullConsumer c = new DefaultLitePullConsumer(h.group);
        c.setNamesrvAddr(h.opts.namesrv);
        c.setVipChannelEnabled(false);
        c.setClientIP("127.0.0.1");
        c.setInstanceName(h.runId + "-lite");
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.setAutoCommit(false);
        c.subscribe(h.topic, "*");
        DefaultMQProducer p = h.producer("pg-" + h.runId);
        Map<String, AtomicInteger> seen = new ConcurrentHashMap<>();
        Set<String> expected = new HashSet<>();
        c.start();
        p.start();
        try {
            for (int i = 0; i < h.count; i++) {
                String key = "lite-" + i;
                expected.add(key);
                sent("sync", key, p.send(message(h.topic, "TagA", key)));
            }
            while (!seen.keySet().containsAll(expected)) {
                if (System.currentTimeMillis() > h.deadlineMs) {
                    h.awaitKeys(expected, seen);
                }
                for (MessageExt m : c.poll(500)) {
                    Harness.received("lite", m).emit();
                    seen.computeIfAbsent(m.getKeys(), k -> new AtomicInteger()).incrementAndGet();
                }
            }
            c.commitSync();
            Events.of("committed").put("group", h.group).emit();
        } finally {
            p.shutdown();
            c.shutdown();
        }
    }
}
