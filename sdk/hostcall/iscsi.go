package hostcall

import "github.com/wasmcsi/wasmcsi/abi"

// IscsiLogin logs in to a granted portal's target (sharing one session per
// target between volumes) and answers the LUN's device (iscsi_login).
func IscsiLogin(t *abi.IscsiTarget) (*abi.IscsiLoginResponse, error) {
	resp := new(abi.IscsiLoginResponse)
	return resp, call(iscsiLogin, abi.HostCallIscsiLogin, t, resp)
}

// IscsiLogout releases a LUN; the session ends with its last user
// (iscsi_logout).
func IscsiLogout(t *abi.IscsiTarget) error {
	return call(iscsiLogout, abi.HostCallIscsiLogout, t, nil)
}

// IscsiRescan makes the node see a grown LUN's new size (iscsi_rescan).
func IscsiRescan(t *abi.IscsiTarget) (*abi.IscsiRescanResponse, error) {
	resp := new(abi.IscsiRescanResponse)
	return resp, call(iscsiRescan, abi.HostCallIscsiRescan, t, resp)
}

// IscsiInitiatorName answers the node's iSCSI initiator name, for a module
// to report in node_info (iscsi_initiator_name).
func IscsiInitiatorName() (string, error) {
	resp := new(abi.IscsiInitiatorName)
	if err := call(iscsiInitiatorName, abi.HostCallIscsiInitiatorName, &abi.Empty{}, resp); err != nil {
		return "", err
	}
	return resp.Name, nil
}
