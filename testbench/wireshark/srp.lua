-- SCSI RDMA Protocol (SRP, SRP-2) over InfiniBand/RoCEv2, for tshark 4.0+.
--
-- tshark has no SRP dissector (its "srp" is H.324's Simple Retransmission Protocol),
-- and its RPC-over-RDMA heuristic claims 36-byte SRP_RSPs as RDMA_NOMSG; the capture
-- checker disables that heuristic. This script is the project's own reading of SRP,
-- written from the layouts of Linux include/scsi/srp.h (big-endian throughout):
--
--   * a heuristic on RC SEND FIRST / SEND ONLY payloads ("infiniband.payload") that
--     claims SRP information units by opcode and reserved-zero fields, and decodes
--     SRP_CMD (CDB, LUN, data-out/data-in descriptors: direct, indirect, immediate),
--     SRP_RSP (status, residuals, response and sense data), SRP_TSK_MGMT, the logouts,
--     credit and AER requests and responses;
--   * a heuristic on CM private data ("infiniband.mad.cm.private") for the login: the
--     56-byte compact srp_login_req_rdma behind RDMA-CM's IP header in a REQ,
--     SRP_LOGIN_RSP in a REP, SRP_LOGIN_REJ in a REJ.
--
-- A claimed IU whose lengths do not add up (descriptors past the end, sense or response
-- data past the end, a descriptor format that does not exist, an indirect table whose
-- total is not the sum of its entries) gets an expert item of severity error
-- ("srprdma.malformed"), which the capture checker reports.

local srp = Proto("srprdma", "SCSI RDMA Protocol")

local opcodes = {
    [0x00] = "SRP_LOGIN_REQ", [0x01] = "SRP_TSK_MGMT", [0x02] = "SRP_CMD", [0x03] = "SRP_I_LOGOUT",
    [0x80] = "SRP_T_LOGOUT", [0x81] = "SRP_CRED_REQ", [0x82] = "SRP_AER_REQ",
    [0x41] = "SRP_CRED_RSP", [0x42] = "SRP_AER_RSP",
    [0xC0] = "SRP_LOGIN_RSP", [0xC1] = "SRP_RSP", [0xC2] = "SRP_LOGIN_REJ",
}
local formats = { [0] = "none", [1] = "direct", [2] = "indirect", [3] = "immediate" }
local tsk_functions = {
    [0x01] = "ABORT TASK", [0x02] = "ABORT TASK SET", [0x04] = "CLEAR TASK SET",
    [0x08] = "LOGICAL UNIT RESET", [0x40] = "CLEAR ACA",
}
local rej_reasons = {
    [0x00010000] = "Unable to establish RDMA channel",
    [0x00010001] = "Insufficient RDMA channel resources",
    [0x00010002] = "Requested max IT IU length too large",
    [0x00010003] = "Unable to associate RDMA channel with I_T nexus",
    [0x00010004] = "Unsupported data buffer descriptor format",
    [0x00010005] = "Multiple RDMA channels not supported",
    [0x00010006] = "RDMA channel limit reached",
}
local scsi_status = {
    [0x00] = "GOOD", [0x02] = "CHECK CONDITION", [0x08] = "BUSY", [0x18] = "RESERVATION CONFLICT",
    [0x28] = "TASK SET FULL", [0x40] = "TASK ABORTED",
}
local scsi_ops = {
    [0x00] = "TEST UNIT READY", [0x03] = "REQUEST SENSE", [0x12] = "INQUIRY", [0x1A] = "MODE SENSE(6)",
    [0x1B] = "START STOP UNIT", [0x25] = "READ CAPACITY(10)", [0x28] = "READ(10)", [0x2A] = "WRITE(10)",
    [0x35] = "SYNCHRONIZE CACHE(10)", [0x42] = "UNMAP", [0x5A] = "MODE SENSE(10)", [0x88] = "READ(16)",
    [0x8A] = "WRITE(16)", [0x91] = "SYNCHRONIZE CACHE(16)", [0x93] = "WRITE SAME(16)",
    [0x9E] = "SERVICE ACTION IN(16)", [0xA0] = "REPORT LUNS", [0xA3] = "MAINTENANCE IN",
}

local f = {
    opcode = ProtoField.uint8("srprdma.opcode", "Opcode", base.HEX, opcodes),
    tag = ProtoField.uint64("srprdma.tag", "Tag", base.HEX),
    sol_not = ProtoField.uint8("srprdma.sol_not", "Solicited notification", base.HEX),
    req_lim_delta = ProtoField.uint32("srprdma.req_lim_delta", "Request limit delta", base.DEC),
    -- login
    it_iu_len = ProtoField.uint32("srprdma.login.it_iu_len", "Max initiator-to-target IU length", base.DEC),
    ti_iu_len = ProtoField.uint32("srprdma.login.ti_iu_len", "Max target-to-initiator IU length", base.DEC),
    buf_fmt = ProtoField.uint16("srprdma.login.buf_fmt", "Buffer formats", base.HEX),
    req_flags = ProtoField.uint8("srprdma.login.flags", "Flags", base.HEX),
    imm_offset = ProtoField.uint16("srprdma.login.imm_data_offset", "Immediate data offset", base.DEC),
    initiator_port = ProtoField.bytes("srprdma.login.initiator_port_id", "Initiator port ID"),
    target_port = ProtoField.bytes("srprdma.login.target_port_id", "Target port ID"),
    rej_reason = ProtoField.uint32("srprdma.login.reason", "Reject reason", base.HEX, rej_reasons),
    -- command
    buf_fmt_out = ProtoField.uint8("srprdma.cmd.data_out_format", "Data-out descriptor format", base.DEC, formats, 0xF0),
    buf_fmt_in = ProtoField.uint8("srprdma.cmd.data_in_format", "Data-in descriptor format", base.DEC, formats, 0x0F),
    out_count = ProtoField.uint8("srprdma.cmd.data_out_count", "Data-out descriptor count", base.DEC),
    in_count = ProtoField.uint8("srprdma.cmd.data_in_count", "Data-in descriptor count", base.DEC),
    lun = ProtoField.uint64("srprdma.lun", "LUN", base.HEX),
    task_attr = ProtoField.uint8("srprdma.cmd.task_attr", "Task attribute", base.DEC),
    add_cdb_len = ProtoField.uint8("srprdma.cmd.add_cdb_len", "Additional CDB length", base.DEC),
    cdb = ProtoField.bytes("srprdma.cmd.cdb", "CDB"),
    scsi_op = ProtoField.uint8("srprdma.cmd.scsi_opcode", "SCSI operation", base.HEX, scsi_ops),
    desc_va = ProtoField.uint64("srprdma.desc.va", "Virtual address", base.HEX),
    desc_key = ProtoField.uint32("srprdma.desc.key", "R_Key", base.HEX),
    desc_len = ProtoField.uint32("srprdma.desc.len", "Length", base.DEC),
    total_len = ProtoField.uint32("srprdma.desc.total_len", "Total length", base.DEC),
    imm_len = ProtoField.uint32("srprdma.desc.immediate_len", "Immediate data length", base.DEC),
    -- response
    rsp_flags = ProtoField.uint8("srprdma.rsp.flags", "Flags", base.HEX),
    status = ProtoField.uint8("srprdma.rsp.status", "SCSI status", base.HEX, scsi_status),
    dout_res = ProtoField.uint32("srprdma.rsp.data_out_residual", "Data-out residual count", base.DEC),
    din_res = ProtoField.uint32("srprdma.rsp.data_in_residual", "Data-in residual count", base.DEC),
    sense_len = ProtoField.uint32("srprdma.rsp.sense_len", "Sense data length", base.DEC),
    resp_len = ProtoField.uint32("srprdma.rsp.resp_len", "Response data length", base.DEC),
    resp_data = ProtoField.bytes("srprdma.rsp.response_data", "Response data"),
    sense = ProtoField.bytes("srprdma.rsp.sense", "Sense data"),
    sense_key = ProtoField.uint8("srprdma.rsp.sense_key", "Sense key", base.HEX),
    asc = ProtoField.uint16("srprdma.rsp.asc_ascq", "ASC/ASCQ", base.HEX),
    -- task management and logout
    tsk_func = ProtoField.uint8("srprdma.tsk.function", "Function", base.HEX, tsk_functions),
    task_tag = ProtoField.uint64("srprdma.tsk.task_tag", "Task tag", base.HEX),
    reason = ProtoField.uint32("srprdma.logout.reason", "Reason", base.DEC),
}
local field_list = {}
for _, v in pairs(f) do table.insert(field_list, v) end
srp.fields = field_list

local e_malformed = ProtoExpert.new("srprdma.malformed", "Malformed SRP information unit",
    expert.group.MALFORMED, expert.severity.ERROR)
srp.experts = { e_malformed }

local bth_opcode = Field.new("infiniband.bth.opcode")

local function zero(tvb, offset, length)
    if tvb:len() < offset + length then return false end
    for i = offset, offset + length - 1 do
        if tvb(i, 1):uint() ~= 0 then return false end
    end
    return true
end

local function malformed(tree, tvb, what)
    tree:add_proto_expert_info(e_malformed, what)
end

local function direct(tree, tvb, offset, label)
    local sub = tree:add(srp, tvb(offset, 16), label)
    sub:add(f.desc_va, tvb(offset, 8))
    sub:add(f.desc_key, tvb(offset + 8, 4))
    sub:add(f.desc_len, tvb(offset + 12, 4))
    return tvb(offset + 12, 4):uint()
end

-- Decodes one direction's descriptor at `offset`; returns the bytes it took, or nil
-- when the IU ends first.
local function descriptor(tree, tvb, offset, format, count, label)
    local len = tvb:len()
    if format == 0 then return 0 end
    if format == 1 then
        if len < offset + 16 then return nil end
        direct(tree, tvb, offset, label .. ": direct descriptor")
        return 16
    elseif format == 3 then
        if len < offset + 4 then return nil end
        tree:add(f.imm_len, tvb(offset, 4))
        return 4
    elseif format == 2 then
        local size = 20 + 16 * count
        if len < offset + size then return nil end
        local sub = tree:add(srp, tvb(offset, size), label .. ": indirect descriptor table")
        local table_len = direct(sub, tvb, offset, "Table descriptor")
        sub:add(f.total_len, tvb(offset + 16, 4))
        local total = tvb(offset + 16, 4):uint()
        local sum = 0
        for i = 0, count - 1 do
            sum = sum + direct(sub, tvb, offset + 20 + 16 * i, "Entry " .. i)
        end
        if table_len % 16 ~= 0 then
            malformed(sub, tvb, "table descriptor length " .. table_len .. " is not a multiple of 16")
        elseif math.floor(table_len / 16) == count and sum ~= total then
            malformed(sub, tvb, "total length " .. total .. " but the entries sum to " .. sum)
        end
        return size
    end
    return nil
end

local function dissect_cmd(tree, tvb, pinfo)
    local len = tvb:len()
    local fmt = tvb(5, 1):uint()
    tree:add(f.sol_not, tvb(1, 1))
    tree:add(f.buf_fmt_out, tvb(5, 1))
    tree:add(f.buf_fmt_in, tvb(5, 1))
    tree:add(f.out_count, tvb(6, 1))
    tree:add(f.in_count, tvb(7, 1))
    tree:add(f.tag, tvb(8, 8))
    tree:add(f.lun, tvb(20, 8))
    tree:add(f.task_attr, tvb(29, 1))
    tree:add(f.add_cdb_len, tvb(31, 1))
    tree:add(f.cdb, tvb(32, 16))
    tree:add(f.scsi_op, tvb(32, 1))
    local op = tvb(32, 1):uint()
    pinfo.cols.info:append(" " .. (scsi_ops[op] or string.format("opcode 0x%02x", op))
        .. string.format(" LUN %d", tvb(21, 1):uint()))
    local out_fmt, in_fmt = bit32.rshift(fmt, 4), bit32.band(fmt, 0x0F)
    if out_fmt > 3 or in_fmt > 2 then
        malformed(tree, tvb, string.format("descriptor formats 0x%02x", fmt))
        return
    end
    local offset = 48 + bit32.band(tvb(31, 1):uint(), 0xFC)
    if len < offset then
        malformed(tree, tvb, "additional CDB past the end of the IU")
        return
    end
    local used = descriptor(tree, tvb, offset, out_fmt, tvb(6, 1):uint(), "Data-out")
    if used == nil then
        malformed(tree, tvb, "data-out descriptor past the end of the IU")
        return
    end
    local used_in = descriptor(tree, tvb, offset + used, in_fmt, tvb(7, 1):uint(), "Data-in")
    if used_in == nil then
        malformed(tree, tvb, "data-in descriptor past the end of the IU")
    end
end

local function dissect_rsp(tree, tvb, pinfo)
    local len = tvb:len()
    tree:add(f.sol_not, tvb(1, 1))
    tree:add(f.req_lim_delta, tvb(4, 4))
    tree:add(f.tag, tvb(8, 8))
    tree:add(f.rsp_flags, tvb(18, 1))
    tree:add(f.status, tvb(19, 1))
    tree:add(f.dout_res, tvb(20, 4))
    tree:add(f.din_res, tvb(24, 4))
    tree:add(f.sense_len, tvb(28, 4))
    tree:add(f.resp_len, tvb(32, 4))
    local flags = tvb(18, 1):uint()
    local status = tvb(19, 1):uint()
    pinfo.cols.info:append(" " .. (scsi_status[status] or string.format("status 0x%02x", status)))
    if bit32.band(flags, 0x0C) == 0x0C or bit32.band(flags, 0x30) == 0x30 then
        malformed(tree, tvb, "both overflow and underflow for one direction")
    end
    local resp_len = (bit32.band(flags, 0x01) ~= 0) and tvb(32, 4):uint() or 0
    local sense_len = (bit32.band(flags, 0x02) ~= 0) and tvb(28, 4):uint() or 0
    if 36 + resp_len + sense_len > len then
        malformed(tree, tvb, "response and sense data past the end of the IU")
        return
    end
    if resp_len > 0 then
        tree:add(f.resp_data, tvb(36, resp_len))
        if resp_len >= 4 then
            pinfo.cols.info:append(string.format(" (task management response %d)", tvb(39, 1):uint()))
        end
    end
    if sense_len > 0 then
        local s = 36 + resp_len
        local sub = tree:add(f.sense, tvb(s, sense_len))
        local code = bit32.band(tvb(s, 1):uint(), 0x7F)
        if (code == 0x70 or code == 0x71) and sense_len >= 14 then
            sub:add(f.sense_key, tvb(s + 2, 1), bit32.band(tvb(s + 2, 1):uint(), 0x0F))
            sub:add(f.asc, tvb(s + 12, 2))
        elseif (code == 0x72 or code == 0x73) and sense_len >= 4 then
            sub:add(f.sense_key, tvb(s + 1, 1), bit32.band(tvb(s + 1, 1):uint(), 0x0F))
            sub:add(f.asc, tvb(s + 2, 2))
        end
    end
end

local function dissect_iu(tvb, pinfo, root)
    local op = tvb(0, 1):uint()
    pinfo.cols.protocol = "SRP"
    pinfo.cols.info = opcodes[op] or "SRP"
    local tree = root:add(srp, tvb(), "SCSI RDMA Protocol, " .. (opcodes[op] or "?"))
    tree:add(f.opcode, tvb(0, 1))
    if op == 0x02 then
        dissect_cmd(tree, tvb, pinfo)
    elseif op == 0xC1 then
        dissect_rsp(tree, tvb, pinfo)
    elseif op == 0x01 then
        tree:add(f.sol_not, tvb(1, 1))
        tree:add(f.tag, tvb(8, 8))
        tree:add(f.lun, tvb(20, 8))
        tree:add(f.tsk_func, tvb(30, 1))
        tree:add(f.task_tag, tvb(32, 8))
        pinfo.cols.info:append(" " .. (tsk_functions[tvb(30, 1):uint()] or "unknown function"))
    elseif op == 0x80 or op == 0x81 or op == 0x82 then
        tree:add(f.sol_not, tvb(1, 1))
        if op == 0x80 then tree:add(f.reason, tvb(4, 4)) else tree:add(f.req_lim_delta, tvb(4, 4)) end
        tree:add(f.tag, tvb(8, 8))
        if op == 0x82 then
            tree:add(f.lun, tvb(20, 8))
            tree:add(f.sense_len, tvb(28, 4))
            if 36 + tvb(28, 4):uint() > tvb:len() then
                malformed(tree, tvb, "sense data past the end of the IU")
            end
        end
    else
        tree:add(f.tag, tvb(8, 8))
    end
    return true
end

-- The IU sizes and reserved-zero fields that tell SRP from other SEND payloads.
local function looks_like_iu(tvb)
    local len = tvb:len()
    if len < 16 then return false end
    local op = tvb(0, 1):uint()
    if op == 0x02 then
        return len >= 48 and zero(tvb, 2, 3) and zero(tvb, 16, 4) and zero(tvb, 28, 1) and zero(tvb, 30, 1)
    elseif op == 0xC1 then
        return len >= 36 and zero(tvb, 2, 2) and zero(tvb, 16, 2) and bit32.band(tvb(18, 1):uint(), 0xC0) == 0
    elseif op == 0x01 then
        return len >= 48 and zero(tvb, 2, 6) and zero(tvb, 16, 4) and zero(tvb, 28, 2) and zero(tvb, 31, 1)
            and zero(tvb, 40, 8)
    elseif op == 0x03 or op == 0x41 or op == 0x42 then
        return len == 16 and zero(tvb, 1, 7)
    elseif op == 0x80 or op == 0x81 then
        return len == 16 and zero(tvb, 2, 2)
    elseif op == 0x82 then
        return len >= 36 and zero(tvb, 2, 2) and zero(tvb, 16, 4) and zero(tvb, 32, 4)
    end
    return false
end

local function payload_heuristic(tvb, pinfo, root)
    -- IUs are the payload of SENDs: RC SEND FIRST (0x00) or SEND ONLY (0x04).
    local bth = bth_opcode()
    if bth == nil or (bth.value ~= 0x00 and bth.value ~= 0x04) then return false end
    if not looks_like_iu(tvb) then return false end
    return dissect_iu(tvb, pinfo, root)
end
srp:register_heuristic("infiniband.payload", payload_heuristic)

-- Login in CM private data.
local function login_heuristic(tvb, pinfo, root)
    local len = tvb:len()
    -- REQ over RDMA-CM: the 36-byte IP header (major version 0, IPv4/6 in bits 7:4 of
    -- byte 1), then the 56-byte compact login (opcode at its byte 11).
    for _, base_offset in ipairs({ 36, 0 }) do
        if len >= base_offset + 56 and tvb(base_offset + 11, 1):uint() == 0x00
            and bit32.band(tvb(base_offset + 8, 2):uint(), 0xFFF9) == 0 and zero(tvb, base_offset + 50, 6)
            and bit32.band(tvb(base_offset + 10, 1):uint(), 0x7C) == 0 and tvb(base_offset + 12, 4):uint() >= 64 then
            local t = tvb(base_offset, 56)
            pinfo.cols.protocol = "SRP"
            pinfo.cols.info:append(", SRP_LOGIN_REQ")
            local tree = root:add(srp, t, "SCSI RDMA Protocol, SRP_LOGIN_REQ (srp_login_req_rdma)")
            tree:add(f.tag, t(0, 8))
            tree:add(f.buf_fmt, t(8, 2))
            tree:add(f.req_flags, t(10, 1))
            tree:add(f.opcode, t(11, 1))
            tree:add(f.it_iu_len, t(12, 4))
            tree:add(f.initiator_port, t(16, 16))
            tree:add(f.target_port, t(32, 16))
            tree:add(f.imm_offset, t(48, 2))
            return true
        end
    end
    if len >= 52 and tvb(0, 1):uint() == 0xC0 and zero(tvb, 1, 3) and zero(tvb, 27, 25) then
        local t = tvb(0, 52)
        pinfo.cols.protocol = "SRP"
        pinfo.cols.info:append(", SRP_LOGIN_RSP")
        local tree = root:add(srp, t, "SCSI RDMA Protocol, SRP_LOGIN_RSP")
        tree:add(f.opcode, t(0, 1))
        tree:add(f.req_lim_delta, t(4, 4))
        tree:add(f.tag, t(8, 8))
        tree:add(f.it_iu_len, t(16, 4))
        tree:add(f.ti_iu_len, t(20, 4))
        tree:add(f.buf_fmt, t(24, 2))
        tree:add(f.req_flags, t(26, 1))
        return true
    end
    if len >= 32 and tvb(0, 1):uint() == 0xC2 and zero(tvb, 1, 3) and zero(tvb, 16, 8) and zero(tvb, 26, 6) then
        local t = tvb(0, 32)
        pinfo.cols.protocol = "SRP"
        pinfo.cols.info:append(", SRP_LOGIN_REJ")
        local tree = root:add(srp, t, "SCSI RDMA Protocol, SRP_LOGIN_REJ")
        tree:add(f.opcode, t(0, 1))
        tree:add(f.rej_reason, t(4, 4))
        tree:add(f.tag, t(8, 8))
        tree:add(f.buf_fmt, t(24, 2))
        return true
    end
    return false
end
srp:register_heuristic("infiniband.mad.cm.private", login_heuristic)
