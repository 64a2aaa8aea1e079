"""What calls other systems: the hub and pulls, the MCP client, the webhook sender, and
the hosts guard every outbound connection goes through."""
