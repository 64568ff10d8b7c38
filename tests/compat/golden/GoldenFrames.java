// GoldenFrames: writes golden bytes made by the real RocketMQ 4.9.7 classes (remoting, common,
// fastjson) as .hex files, one per case, for protocol/rocketmq's unit tests (no Java at test
// time). Run by tests/compat/golden/generate.sh; its output is committed under encoded/.
import com.alibaba.fastjson.serializer.SerializerFeature;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import org.apache.rocketmq.common.MQVersion;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.common.protocol.RequestCode;
import org.apache.rocketmq.common.protocol.ResponseCode;
import org.apache.rocketmq.common.protocol.body.ClusterInfo;
import org.apache.rocketmq.common.protocol.body.LockBatchRequestBody;
import org.apache.rocketmq.common.protocol.body.LockBatchResponseBody;
import org.apache.rocketmq.common.protocol.body.TopicList;
import org.apache.rocketmq.common.protocol.header.PullMessageRequestHeader;
import org.apache.rocketmq.common.protocol.header.PullMessageResponseHeader;
import org.apache.rocketmq.common.protocol.header.SendMessageRequestHeader;
import org.apache.rocketmq.common.protocol.header.SendMessageRequestHeaderV2;
import org.apache.rocketmq.common.protocol.header.SendMessageResponseHeader;
import org.apache.rocketmq.common.protocol.heartbeat.ConsumeType;
import org.apache.rocketmq.common.protocol.heartbeat.ConsumerData;
import org.apache.rocketmq.common.protocol.heartbeat.HeartbeatData;
import org.apache.rocketmq.common.protocol.heartbeat.MessageModel;
import org.apache.rocketmq.common.protocol.heartbeat.ProducerData;
import org.apache.rocketmq.common.protocol.heartbeat.SubscriptionData;
import org.apache.rocketmq.common.protocol.route.BrokerData;
import org.apache.rocketmq.common.protocol.route.QueueData;
import org.apache.rocketmq.common.protocol.route.TopicRouteData;
import org.apache.rocketmq.remoting.protocol.RemotingCommand;
import org.apache.rocketmq.remoting.protocol.SerializeType;

public class GoldenFrames {
    static Path out;

    static void write(String name, byte[] bytes) throws Exception {
        StringBuilder sb = new StringBuilder();
        for (byte b : bytes) {
            sb.append(String.format("%02x", b));
        }
        sb.append('\n');
        Files.write(out.resolve(name + ".hex"), sb.toString().getBytes(StandardCharsets.US_ASCII));
    }

    static byte[] frame(RemotingCommand cmd) {
        ByteBuffer b = cmd.encode();
        byte[] bytes = new byte[b.remaining()];
        b.get(bytes);
        return bytes;
    }

    static SendMessageRequestHeader sendHeader() {
        SendMessageRequestHeader h = new SendMessageRequestHeader();
        h.setProducerGroup("pg");
        h.setTopic("orders");
        h.setDefaultTopic("TBW102");
        h.setDefaultTopicQueueNums(4);
        h.setQueueId(3);
        h.setSysFlag(0);
        h.setBornTimestamp(1700000000123L);
        h.setFlag(0);
        h.setProperties("KEYS\u0001order-42\u0002TAGS\u0001paid\u0002");
        h.setReconsumeTimes(0);
        h.setUnitMode(false);
        h.setBatch(false);
        return h;
    }

    static void frames() throws Exception {
        for (SerializeType type : SerializeType.values()) {
            String t = type.name().toLowerCase();
            RemotingCommand v1 = RemotingCommand.createRequestCommand(RequestCode.SEND_MESSAGE, sendHeader());
            v1.setOpaque(7);
            v1.setBody("hello".getBytes(StandardCharsets.UTF_8));
            v1.setSerializeTypeCurrentRPC(type);
            write("send_v1_" + t, frame(v1));

            RemotingCommand v2 = RemotingCommand.createRequestCommand(RequestCode.SEND_MESSAGE_V2,
                SendMessageRequestHeaderV2.createSendMessageRequestHeaderV2(sendHeader()));
            v2.setOpaque(8);
            v2.setBody("hello".getBytes(StandardCharsets.UTF_8));
            v2.setSerializeTypeCurrentRPC(type);
            write("send_v2_" + t, frame(v2));

            RemotingCommand resp = RemotingCommand.createResponseCommand(SendMessageResponseHeader.class);
            SendMessageResponseHeader rh = (SendMessageResponseHeader) resp.readCustomHeader();
            rh.setMsgId("7F00000100002A9F0000000000001234");
            rh.setQueueId(3);
            rh.setQueueOffset(42L);
            resp.setCode(ResponseCode.SUCCESS);
            resp.setOpaque(8);
            resp.setSerializeTypeCurrentRPC(type);
            write("send_response_" + t, frame(resp));

            PullMessageRequestHeader ph = new PullMessageRequestHeader();
            ph.setConsumerGroup("billing");
            ph.setTopic("orders");
            ph.setQueueId(1);
            ph.setQueueOffset(100L);
            ph.setMaxMsgNums(32);
            ph.setSysFlag(6);
            ph.setCommitOffset(99L);
            ph.setSuspendTimeoutMillis(15000L);
            ph.setSubscription("paid || created");
            ph.setSubVersion(1700000000000L);
            ph.setExpressionType("TAG");
            RemotingCommand pull = RemotingCommand.createRequestCommand(RequestCode.PULL_MESSAGE, ph);
            pull.setOpaque(9);
            pull.setSerializeTypeCurrentRPC(type);
            write("pull_" + t, frame(pull));

            RemotingCommand presp = RemotingCommand.createResponseCommand(PullMessageResponseHeader.class);
            PullMessageResponseHeader prh = (PullMessageResponseHeader) presp.readCustomHeader();
            prh.setSuggestWhichBrokerId(0L);
            prh.setNextBeginOffset(101L);
            prh.setMinOffset(0L);
            prh.setMaxOffset(101L);
            presp.setCode(ResponseCode.PULL_NOT_FOUND);
            presp.setRemark("no new message");
            presp.setOpaque(9);
            presp.setBody(new byte[] {1, 2, 3});
            presp.setSerializeTypeCurrentRPC(type);
            write("pull_response_" + t, frame(presp));

            RemotingCommand oneway = RemotingCommand.createRequestCommand(RequestCode.UNREGISTER_CLIENT, null);
            oneway.markOnewayRPC();
            oneway.setOpaque(10);
            oneway.setRemark("bye \u00e9");
            oneway.setSerializeTypeCurrentRPC(type);
            write("oneway_" + t, frame(oneway));

            RemotingCommand bare = RemotingCommand.createResponseCommand(ResponseCode.SYSTEM_ERROR,
                "request type 999 not supported");
            bare.setOpaque(11);
            bare.setSerializeTypeCurrentRPC(type);
            write("error_response_" + t, frame(bare));
        }
    }

    static MessageExt storedMessage(boolean withTrace) throws Exception {
        MessageExt m = new MessageExt();
        m.setTopic("orders");
        m.setBody("paid: 42".getBytes(StandardCharsets.UTF_8));
        m.setTags("paid");
        m.setKeys("order-42 order-43");
        m.putUserProperty("region", "eu");
        if (withTrace) {
            m.putUserProperty("amount", "120");
        }
        m.setQueueId(2);
        m.setFlag(0);
        m.setQueueOffset(17L);
        m.setCommitLogOffset(123456789L);
        m.setSysFlag(0);
        m.setBornTimestamp(1700000000123L);
        m.setBornHost(new InetSocketAddress("127.0.0.1", 50123));
        m.setStoreTimestamp(1700000000456L);
        m.setStoreHost(new InetSocketAddress("127.0.0.1", 10911));
        m.setReconsumeTimes(1);
        m.setPreparedTransactionOffset(0L);
        m.setBodyCRC(0x1234abcd);
        return m;
    }

    static void messages() throws Exception {
        MessageExt m = storedMessage(true);
        write("stored_message", MessageDecoder.encode(m, false));
        write("stored_message_properties", MessageDecoder.messageProperties2String(m.getProperties())
            .getBytes(StandardCharsets.UTF_8));
        ByteBuffer host = ByteBuffer.allocate(8);
        host.put(new byte[] {127, 0, 0, 1});
        host.putInt(10911);
        host.flip();
        String id = MessageDecoder.createMessageId(ByteBuffer.allocate(16), host, 123456789L);
        write("message_id", id.getBytes(StandardCharsets.US_ASCII));

        List<Message> batch = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
            Message b = new Message("orders", "t" + i, "k" + i, ("body-" + i).getBytes(StandardCharsets.UTF_8));
            b.setWaitStoreMsgOK(true);
            batch.add(b);
        }
        write("batch_body", MessageDecoder.encodeMessages(batch));
    }

    static TopicRouteData route() {
        TopicRouteData r = new TopicRouteData();
        QueueData q = new QueueData();
        q.setBrokerName("group-a");
        q.setReadQueueNums(8);
        q.setWriteQueueNums(8);
        q.setPerm(6);
        q.setTopicSysFlag(0);
        r.setQueueDatas(new ArrayList<>(Arrays.asList(q)));
        HashMap<Long, String> addrs = new HashMap<>();
        addrs.put(0L, "127.0.0.1:10911");
        addrs.put(1L, "127.0.0.1:10921");
        addrs.put(2L, "127.0.0.1:10931");
        r.setBrokerDatas(new ArrayList<>(Arrays.asList(new BrokerData("RaftMQ", "group-a", addrs))));
        r.setFilterServerTable(new HashMap<>());
        return r;
    }

    static void bodies() throws Exception {
        TopicRouteData r = route();
        write("route_fastjson", r.encode());
        write("route_standard", r.encode(SerializerFeature.BrowserCompatible, SerializerFeature.QuoteFieldNames,
            SerializerFeature.SkipTransientField, SerializerFeature.MapSortField));

        ClusterInfo c = new ClusterInfo();
        HashMap<String, BrokerData> brokers = new HashMap<>();
        brokers.put("group-a", r.getBrokerDatas().get(0));
        c.setBrokerAddrTable(brokers);
        HashMap<String, java.util.Set<String>> clusters = new HashMap<>();
        clusters.put("RaftMQ", new HashSet<>(Arrays.asList("group-a")));
        c.setClusterAddrTable(clusters);
        write("cluster_info", c.encode());

        TopicList t = new TopicList();
        t.setTopicList(new HashSet<>(Arrays.asList("orders", "payments")));
        write("topic_list", t.encode());

        HeartbeatData hb = new HeartbeatData();
        hb.setClientID("127.0.0.1@4242");
        ProducerData pd = new ProducerData();
        pd.setGroupName("pg");
        hb.getProducerDataSet().add(pd);
        ConsumerData cd = new ConsumerData();
        cd.setGroupName("billing");
        cd.setConsumeType(ConsumeType.CONSUME_PASSIVELY);
        cd.setMessageModel(MessageModel.CLUSTERING);
        cd.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        SubscriptionData sd = new SubscriptionData("orders", "paid || created");
        sd.getTagsSet().add("paid");
        sd.getTagsSet().add("created");
        sd.getCodeSet().add("paid".hashCode());
        sd.getCodeSet().add("created".hashCode());
        sd.setSubVersion(1700000000000L);
        cd.getSubscriptionDataSet().add(sd);
        cd.setUnitMode(false);
        hb.getConsumerDataSet().add(cd);
        write("heartbeat", hb.encode());

        LockBatchRequestBody lock = new LockBatchRequestBody();
        lock.setConsumerGroup("billing");
        lock.setClientId("127.0.0.1@4242");
        lock.getMqSet().add(new MessageQueue("orders", "group-a", 1));
        write("lock_batch_request", lock.encode());
        LockBatchResponseBody locked = new LockBatchResponseBody();
        locked.getLockOKMQSet().add(new MessageQueue("orders", "group-a", 1));
        write("lock_batch_response", locked.encode());

        write("version_v4_9_4", Integer.toString(MQVersion.Version.V4_9_4.ordinal()).getBytes(StandardCharsets.US_ASCII));
        write("version_current", Integer.toString(MQVersion.CURRENT_VERSION).getBytes(StandardCharsets.US_ASCII));
    }

    public static void main(String[] args) throws Exception {
        out = Path.of(args[0]);
        Files.createDirectories(out);
        frames();
        messages();
        bodies();
    }
}
