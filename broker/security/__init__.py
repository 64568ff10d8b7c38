"""Who may do what: authentication (SCRAM), the request-to-need map, the authorizer and access
control, TLS of the client port, exposure checks, and the name server's registration proof."""
