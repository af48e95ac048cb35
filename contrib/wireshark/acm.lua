-- Wireshark/tshark dissector for InfiniBand ACM MADs (management class 0x2C).
--
-- ibacm daemons resolve addresses by exchanging 256-byte class 0x2C MADs on their UD QPs
-- (mad-protocol.md sections 2-3): a 16-byte header without attribute fields, then the
-- resolve record (address types and lengths, gid_cnt, the 64-byte destination and source
-- addresses and up to six 16-byte MGIDs, lowest preference first).
--
-- Usage:
--   tshark -X lua_script:contrib/wireshark/acm.lua -r capture.pcap -V
--   wireshark: copy this file to ~/.local/lib/wireshark/plugins/ (or run with -X lua_script:)
--
-- ACM MADs travel on ordinary UD QPs, so Wireshark's InfiniBand dissector hands their bytes
-- to the "infiniband.payload" heuristic table, where this dissector claims them. A MAD
-- carried on QP1 instead (e.g. between ibsim nodes through umad) is shown by the built-in
-- dissector as an undecoded "Application Specific MAD"; the post-dissector below decodes
-- those too. Fields: acm.method, acm.tid, acm.gid_cnt, acm.gid, acm.dest.ip, acm.src.ip, ...

local ACM_CLASS = 0x2C
local MAD_SIZE = 256
local ADDR_LEN = 64
local GID_LEN = 16
local GID_OFFSET = 152
local MAX_GIDS_IN_MAD = 6   -- 152 + 6 * 16 = 248: a seventh MGID would not fit

local acm = Proto("acm", "InfiniBand Communication Management Assistant (ACM)")

local methods = { [0x01] = "Resolve Request", [0x81] = "Resolve Response" }
local address_types = {
    [0] = "Invalid", [1] = "Name", [2] = "IPv4", [3] = "IPv6", [4] = "GID", [5] = "LID",
}
local statuses = {
    [0] = "Success", [1] = "ENOMEM", [2] = "EINVAL", [3] = "ENODATA", [5] = "ENOTCONN",
    [6] = "ETIMEDOUT", [7] = "ESRCADDR", [8] = "ESRCTYPE", [9] = "EDESTADDR", [10] = "EDESTTYPE",
}
local controls = { [0x0001] = "Resolve", [0x8000] = "Ack" }

local f = acm.fields
f.base_version = ProtoField.uint8("acm.base_version", "Base Version", base.DEC)
f.mgmt_class = ProtoField.uint8("acm.mgmt_class", "Management Class", base.HEX)
f.class_version = ProtoField.uint8("acm.class_version", "Class Version", base.DEC)
f.method = ProtoField.uint8("acm.method", "Method", base.HEX, methods)
f.status = ProtoField.uint16("acm.status", "Status", base.HEX)
f.acm_status = ProtoField.uint8("acm.acm_status", "ACM Status", base.DEC, statuses)
f.control = ProtoField.uint16("acm.control", "Control", base.HEX, controls)
f.tid = ProtoField.uint64("acm.tid", "Transaction ID", base.HEX)
f.dest_type = ProtoField.uint8("acm.dest_type", "Destination Type", base.DEC, address_types)
f.dest_length = ProtoField.uint8("acm.dest_length", "Destination Length", base.DEC)
f.src_type = ProtoField.uint8("acm.src_type", "Source Type", base.DEC, address_types)
f.src_length = ProtoField.uint8("acm.src_length", "Source Length", base.DEC)
f.gid_cnt = ProtoField.uint8("acm.gid_cnt", "gid_cnt", base.DEC)
f.resp_resources = ProtoField.uint8("acm.resp_resources", "Responder Resources", base.DEC)
f.init_depth = ProtoField.uint8("acm.init_depth", "Initiator Depth", base.DEC)
f.reserved = ProtoField.uint8("acm.reserved", "Reserved", base.HEX)
f.gid = ProtoField.ipv6("acm.gid", "MGID")
f.padding = ProtoField.bytes("acm.padding", "Unused")

-- One set of address fields per direction, so filters read "acm.dest.ip == 10.0.0.2".
local function address_fields(which, label)
    return {
        raw = ProtoField.bytes("acm." .. which .. ".raw", label .. " Address (raw)"),
        name = ProtoField.string("acm." .. which .. ".name", label .. " Name"),
        ip = ProtoField.ipv4("acm." .. which .. ".ip", label .. " IPv4 Address"),
        ip6 = ProtoField.ipv6("acm." .. which .. ".ip6", label .. " IPv6 Address"),
        gid = ProtoField.ipv6("acm." .. which .. ".gid", label .. " GID"),
        lid = ProtoField.uint16("acm." .. which .. ".lid", label .. " LID", base.DEC),
    }
end
local dest_f = address_fields("dest", "Destination")
local src_f = address_fields("src", "Source")
for key, field in pairs(dest_f) do f["dest_" .. key] = field end
for key, field in pairs(src_f) do f["src_" .. key] = field end

local ex_too_many = ProtoExpert.new("acm.gid_cnt.too_many",
    "gid_cnt claims more MGIDs than fit in a MAD (at most 6)",
    expert.group.MALFORMED, expert.severity.ERROR)
local ex_version = ProtoExpert.new("acm.version.bad",
    "Unsupported base or class version (ACM uses 1 and 1): C peers drop this MAD",
    expert.group.PROTOCOL, expert.severity.WARN)
local ex_control = ProtoExpert.new("acm.control.bad",
    "Control is not 0x0001 (resolve): C peers drop this MAD",
    expert.group.PROTOCOL, expert.severity.WARN)
local ex_length = ProtoExpert.new("acm.length.unusual",
    "Address length is not 64 (ibacm always sends 64)",
    expert.group.PROTOCOL, expert.severity.NOTE)
local ex_short = ProtoExpert.new("acm.short",
    "ACM MAD shorter than 256 bytes", expert.group.MALFORMED, expert.severity.ERROR)
acm.experts = { ex_too_many, ex_version, ex_control, ex_length, ex_short }

-- The text of a 64-byte address of ``addr_type`` and its typed tree item.
local function add_address(tree, range, addr_type, fields)
    if addr_type == 1 then
        local name = range:stringz()
        tree:add(fields.name, range, name)
        return name
    elseif addr_type == 2 then
        tree:add(fields.ip, range(0, 4))
        return tostring(range(0, 4):ipv4())
    elseif addr_type == 3 then
        tree:add(fields.ip6, range(0, 16))
        return tostring(range(0, 16):ipv6())
    elseif addr_type == 4 then
        tree:add(fields.gid, range(0, 16))
        return tostring(range(0, 16):ipv6())
    elseif addr_type == 5 then
        tree:add(fields.lid, range(0, 2))
        return "LID " .. range(0, 2):uint()
    end
    tree:add(fields.raw, range)
    return nil
end

local function dissect_acm(tvb, pinfo, tree)
    local length = tvb:len()
    local subtree = tree:add(acm, tvb(0, math.min(length, MAD_SIZE)))
    if length < MAD_SIZE then
        subtree:add_proto_expert_info(ex_short)
        return length
    end
    local method = tvb(3, 1):uint()
    local status = tvb(4, 2):uint()
    local control = tvb(6, 2):uint()
    local tid = tvb(8, 8):uint64()

    local header = subtree:add(tvb(0, 16), "ACM MAD Header")
    local version_item = header:add(f.base_version, tvb(0, 1))
    header:add(f.mgmt_class, tvb(1, 1))
    local class_item = header:add(f.class_version, tvb(2, 1))
    if tvb(0, 1):uint() ~= 1 then version_item:add_proto_expert_info(ex_version) end
    if tvb(2, 1):uint() ~= 1 then class_item:add_proto_expert_info(ex_version) end
    header:add(f.method, tvb(3, 1))
    local status_item = header:add(f.status, tvb(4, 2))
    status_item:add(f.acm_status, tvb(4, 1))
    local control_item = header:add(f.control, tvb(6, 2))
    if control ~= 0x0001 then control_item:add_proto_expert_info(ex_control) end
    header:add(f.tid, tvb(8, 8))

    local record = subtree:add(tvb(16, MAD_SIZE - 16), "Resolve Record")
    local dest_type, src_type = tvb(16, 1):uint(), tvb(18, 1):uint()
    record:add(f.dest_type, tvb(16, 1))
    local dest_len_item = record:add(f.dest_length, tvb(17, 1))
    record:add(f.src_type, tvb(18, 1))
    local src_len_item = record:add(f.src_length, tvb(19, 1))
    local is_request = method == 0x01
    if is_request and tvb(17, 1):uint() ~= ADDR_LEN then
        dest_len_item:add_proto_expert_info(ex_length)
    end
    if is_request and tvb(19, 1):uint() ~= ADDR_LEN then
        src_len_item:add_proto_expert_info(ex_length)
    end
    local gid_cnt = tvb(20, 1):uint()
    local cnt_item = record:add(f.gid_cnt, tvb(20, 1))
    record:add(f.resp_resources, tvb(21, 1))
    record:add(f.init_depth, tvb(22, 1))
    record:add(f.reserved, tvb(23, 1))

    local dest_tree = record:add(tvb(24, ADDR_LEN), "Destination Address")
    local dest_text = add_address(dest_tree, tvb(24, ADDR_LEN), dest_type, dest_f)
    local src_tree = record:add(tvb(88, ADDR_LEN), "Source Address")
    local src_text = add_address(src_tree, tvb(88, ADDR_LEN), src_type, src_f)
    if dest_text then dest_tree:append_text(": " .. dest_text) end
    if src_text then src_tree:append_text(": " .. src_text) end

    local shown = gid_cnt
    if gid_cnt > MAX_GIDS_IN_MAD then
        cnt_item:add_proto_expert_info(ex_too_many)
        shown = MAX_GIDS_IN_MAD
    end
    local gids = {}
    for i = 0, shown - 1 do
        local range = tvb(GID_OFFSET + i * GID_LEN, GID_LEN)
        local item = record:add(f.gid, range)
        item:prepend_text("gid[" .. i .. "] ")
        gids[#gids + 1] = tostring(range:ipv6())
    end
    local unused_at = GID_OFFSET + shown * GID_LEN
    if unused_at < MAD_SIZE then
        record:add(f.padding, tvb(unused_at, MAD_SIZE - unused_at))
    end

    pinfo.cols.protocol:set("ACM")
    local info = (methods[method] or string.format("Method 0x%02x", method))
    local tid_hex = tid:tohex():gsub("^0+(.)", "%1")
    info = info .. " TID 0x" .. tid_hex
    if is_request then
        info = info .. " dest " .. (dest_text or "?") .. " src " .. (src_text or "?")
        info = info .. " gid_cnt " .. gid_cnt
    else
        local acm_status = math.floor(status / 256)  -- Lua 5.2 has no shift operator
        info = info .. " status " .. (statuses[acm_status] or tostring(acm_status))
        if gids[1] then info = info .. " MGID " .. gids[1] end
    end
    pinfo.cols.info:set(info)
    subtree:append_text(", " .. info)
    return MAD_SIZE
end

acm.dissector = dissect_acm

local function looks_like_acm(tvb)
    return tvb:len() >= MAD_SIZE
        and tvb(0, 1):uint() == 1
        and tvb(1, 1):uint() == ACM_CLASS
        and tvb(2, 1):uint() == 1
end

local function heuristic(tvb, pinfo, tree)
    if not looks_like_acm(tvb) then return false end
    dissect_acm(tvb, pinfo, tree)
    return true
end

acm:register_heuristic("infiniband.payload", heuristic)
DissectorTable.get("infiniband"):add_for_decode_as(acm)

-- ACM MADs on QP1: the built-in MAD parser has already taken them; decode the same bytes.
local acm_gsi = Proto("acm_gsi", "ACM over the GSI (QP1)")
local mad_header_f = Field.new("infiniband.mad")
local mad_class_f = Field.new("infiniband.mad.mgmtclass")

function acm_gsi.dissector(tvb, pinfo, tree)
    local classes = { mad_class_f() }
    local headers = { mad_header_f() }
    for i, class in ipairs(classes) do
        local header = headers[i]
        if class.value == ACM_CLASS and header and header.offset + MAD_SIZE <= tvb:len() then
            local mad = tvb(header.offset, MAD_SIZE):tvb("ACM MAD")
            if looks_like_acm(mad) then dissect_acm(mad, pinfo, tree) end
        end
    end
end

register_postdissector(acm_gsi)
